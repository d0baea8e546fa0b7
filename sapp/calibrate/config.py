"""What a calibration run measures at which sizes (full or quick), and its error type."""
from __future__ import annotations

from ..errors import SappError


class CalibrationError(SappError):
    """Calibration could not run or finish in time."""


FULL = {"gemm": (256, 512, 1024, 1536), "gemm_cuda": (1024, 2048, 4096, 8192), "copy_mb": 128, "ar_bytes": (4096, 65536, 1 << 20, 4 << 20, 16 << 20),
        "curve_kb": (64, 256, 1024, 4096, 16384, 65536), "op_elems": 1 << 19, "min_time": 0.4}
QUICK = {"gemm": (256, 512, 768), "gemm_cuda": (1024, 4096), "copy_mb": 32, "ar_bytes": (4096, 65536, 1 << 20, 4 << 20),
         "curve_kb": (256, 4096, 32768), "op_elems": 1 << 18, "min_time": 0.12}


def cfg_elems(raw) -> float:
    """Elements per op-rate measurement (to take one dispatch out of a per-element time)."""
    return float((QUICK if raw.get("quick") else FULL)["op_elems"])
