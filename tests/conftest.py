"""Suite-wide settings."""
import os

# The capture cache (sapp/capture/cache.py) is off for the suite, its subprocesses included: each test
# captures what it asks for and nothing lands in the user's ~/.cache.  tests/test_capture_cache.py
# turns it on in a temporary folder.
os.environ["SAPP_CACHE_DIR"] = ""
