"""``python -m tools.device_check --out report.json [app flags]``: ``python -m tools.doctor --device-check``."""

import sys

from .report import main

if __name__ == "__main__":
    sys.exit(main())
