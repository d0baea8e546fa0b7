"""Published FP8 runs imported through `sapp import`'s path (bench/published_fp8.py, issue 54): NeMo 25.02's
Megatron-Core GPT3-175B FP8 run on 512 H100 (delayed scaling) and torchtitan's Float8 rows read from each
benchmark's own job files (the 2412 FSDP rows: torchtitan 9dec370; the 2025-06 FSDP x TP 8 rows: 820504e, compiled
casts and float8 tensor-parallel all-gathers), each within +-15% of its published tokens/s per GPU; nothing fitted."""
from __future__ import annotations

import pytest

from bench import published_fp8 as B


def test_the_megatron_fp8_run_imports_with_delayed_scaling_within_15_percent():
    (name, bf16, fp8, pub, _src, _gb, _fits), = B.megatron_rows("NeMo 25.02")
    assert abs(fp8 / pub - 1) <= 0.15, (fp8, pub)
    assert fp8 > 1.3 * bf16               # the same file without its FP8 flags: bf16 GEMMs


@pytest.mark.parametrize("row", ["T1 8B FSDP", "T3 8B FSDP", "70B FSDP32 TP8", "8B FSDP8 TP8"])
def test_torchtitans_float8_rows_from_the_benchmarks_own_files(row):
    for name, pk, bf16, fp8, _pb, pub, _src, _gb in B.rows(row):
        assert abs(fp8 / pub - 1) <= 0.15, (name, pk, fp8, pub)
        assert fp8 > bf16
