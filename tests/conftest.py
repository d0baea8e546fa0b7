"""Suite-wide settings and shared fixtures."""
import os

import pytest

# The capture cache (sapp/capture/cache.py) is off for the suite, its subprocesses included: each test
# captures what it asks for and nothing lands in the user's ~/.cache.  tests/test_capture_cache*.py
# turn it on in a temporary folder (`cache_dir` below).
os.environ["SAPP_CACHE_DIR"] = ""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """The capture cache on, in a temporary folder: returns its entries' folder."""
    monkeypatch.setenv("SAPP_CACHE_DIR", str(tmp_path / "c"))
    return tmp_path / "c" / "capture"


@pytest.fixture(scope="module", autouse=True)
def _no_process_group_from_another_file():
    """A default process group an earlier file's in-process emit left behind (a world of one) is torn
    down before the next file: a file's tests see torch.distributed as they would alone, whichever
    files an xdist worker ran before."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    yield
