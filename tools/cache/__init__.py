"""Portable compile-cache bundles: a manifest of what the cache was built for, export, checked install.

``WarmStart`` is a warm-up hook (``plugin.py`` hands it to ``Backend``): it installs a ``--cache-bundle``
before anything compiles and records the cache once warm-up ends. ``panel.build_export`` adds the
operator's Export button to the warm-up details.
"""

from pathlib import Path

from neuron_backend.messages import read_catalog, register

# the bundles' Arabic joins the one catalog before any text is shown
register(read_catalog(Path(__file__).with_name("arabic.json")))
