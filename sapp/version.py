"""The package version, in a module of its own so that sapp/capture/cache.py reads it without
importing the package (and its entry points) back."""
__version__ = "0.1.0"
