"""Portable compile-cache bundles: a manifest of what the cache was built for, export, checked install."""
