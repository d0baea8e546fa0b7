"""Published FP8 runs imported through `sapp import`'s path and priced with FP8 linears:
`python -m bench.published_fp8 [--only TEXT]`.

torchtitan's Float8 rows.  The 2412 benchmark's rows (benchmarks/llama3_h100_202412_torchtitan.md, Tables
1 and 3: FSDP, Llama 3.1 8B, local batch 2, selective AC, torch.compile + Float8) are that benchmark's own
job file, torchtitan 9dec370's llama3_8b.toml (bench/torchtitan_published/llama3_8b_9dec370.toml) with
batch_size = 2 and compile = true, read as `sapp import --from torchtitan@0.2.2` reads a file of that
schema (sapp/engines/torchtitan_2412.py: the "torchtitan-2412+compile" profile, chosen from the file's
fields), twice: bf16, and with its own `[float8] enable_float8_linear = true` (dynamic tensorwise scales,
no FP8 all-gather, `output` left in bf16 as its float8.py filters it: tensorwise, sapp/engines/fp8.py).
The 2025-06 rows (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, vanilla TP columns: 70B FSDP 32
x TP 8 full AC local batch 16; 8B FSDP 8 x TP 8 op SAC local batch 12) are that benchmark's own job files,
torchtitan 820504e's llama3_8b / 70b.toml (bench/torchtitan_published/llama3_*_820504e.toml) with compile = true
and its converters = ["float8"] line on, read as a file of that schema (sapp/engines/torchtitan_2506.py:
SDPA's FlashAttention-2 by torchtitan's backend order, compiled blocks: "torchtitan-2412+compile"; float8 with
tp: torchao's float8 tensor-parallel styles, the "tensorwise-tp" recipe, all-gathers at one byte).  The
machine is the benchmarks' Grand Teton H100 (96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA a GPU, 500 W),
"between SXM and NVL": priced at both (dense bf16 989 / 835 TFLOP/s, FP8 twice that).  The published
ratio is compile+Float8 / compile.

Megatron-Core FP8: NeMo 25.02's GPT3-175B row on 512 H100 (bench/megatron_args/nemo_2502_gpt3_175b_fp8_h100.args
states the run and its source: TP 4, PP 8, VP 6, MBS 2, GBS 2048, delayed scaling), imported as `sapp import
--from megatron FILE --cluster h100-80g:devices=512` imports it (the model its flags state, the
"fused+tp-overlap" profile), and again without its FP8 flags for sapp's bf16 figure (none published).

Nothing here is fitted to the published rows.  The casts are priced as torch.compile runs them (torchao's
own roofline, sapp/costmodel/fp8.py: amax, one kernel writing both layouts, nothing in backward, identical casts
of one input once); eager they are torchao's ops one kernel each.  Reading (bench/RESULTS.md §23): all rows
within ±15% (2412: +9.6 / -0.3 / +5.6 / -3.4%; 2025-06: +4.5 / -3.2 / -7.7 / -12.1%, sxm / nvl); the FP8 gain
1.20-1.24x against 1.28-1.29x (FSDP) and 1.17-1.36x against 1.16-1.36x (TP 8).  Not priced: the compiled
loss and point-wise chains (SwiGLU, rotary, residual adds: eager kernels), the scalar amax all-reduces over tp,
FP8 activation memory.  The NeMo row's peak (85 GB) is over the 80 GB it ran in: NeMo gathers FP8 weights
(fp8_param_gather, not priced) and Transformer Engine keeps FP8 activations (priced at bf16)."""
from __future__ import annotations

import argparse
import datetime
import sys
import time

from bench.published_torchtitan import GRAND_TETON, PEAKS, job_text, price

SRC_2412 = "llama3_h100_202412_torchtitan.md"
SRC_2506 = "asyncTP_llama3_h100_2025-06_torchtitan.md"
TT_2412 = "llama3_8b_9dec370.toml"          # the 2412 benchmark's own job file (its schema: torchtitan_2412.py)
TT_2506 = "llama3_%s_820504e.toml"          # the 2025-06 benchmark's own job files (torchtitan_2506.py)
# (name, job file, edits, model, nodes, published bf16 (compile), published Float8 (compile), source)
ROWS = [
    ("T1 8B FSDP 8 GPUs", TT_2412, {"batch_size": 2, "compile": "true"}, "llama3-8b", 1, 6667, 8532, SRC_2412),
    ("T3 8B FSDP 128 GPUs", TT_2412, {"batch_size": 2, "compile": "true"}, "llama3-8b", 16, 6514, 8380, SRC_2412),
    ("70B FSDP32 TP8 256 GPUs", TT_2506 % "70b", {"local_batch_size": 16, "compile": "true"}, "llama3-70b", 32,
     597.3, 809.8, SRC_2506),
    ("8B FSDP8 TP8 64 GPUs", TT_2506 % "8b", {"local_batch_size": 12, "tensor_parallel_degree": 8, "compile": "true"},
     "llama3-8b", 8, 4378, 5078.1, SRC_2506),
]
FLOAT8_ON = ('# converters = ["float8"]', 'converters = ["float8"]')     # (820504e's converter name)
# Megatron-Core FP8 (delayed scaling) runs: (name, argument file, cluster, published tokens/s/GPU, source)
MEGATRON = [("NeMo 25.02 GPT3-175B 512 H100", "bench/megatron_args/nemo_2502_gpt3_175b_fp8_h100.args",
             "h100-80g:devices=512", 866, "NeMo 25.02 performance summary, DGX-H100")]
FP8_FLAGS = ("--fp8-format", "--fp8-recipe", "--fp8-amax-history-len", "--fp8-amax-compute-algo")


def _cluster(nodes, peak):
    return GRAND_TETON.format(nodes=nodes, peak=peak) + f",fp8_peak_flops={2 * peak:.0f}"


def _texts(fname, edits):
    """(bf16 job text, Float8 job text): the 2024 schema's [float8] table, or 0.2.2's converter line."""
    if fname == TT_2412:
        return job_text(fname, edits), job_text(fname, {**edits, "enable_float8_linear": "true"})
    text = job_text(fname, edits)
    f8 = text.replace(*FLOAT8_ON)
    assert f8 != text, f"{fname}: no commented float8 converter line to turn on"
    return text, f8


def rows(only=""):
    """[(name, peak, bf16 tok/s, fp8 tok/s, published bf16, published fp8, source, fp8 GiB)]."""
    graphs, out = {}, []
    for name, fname, edits, model, nodes, pub_bf16, pub_fp8, src in ROWS:
        if only not in name:
            continue
        text, f8 = _texts(fname, edits)
        for pk in ("sxm", "nvl"):
            cl = _cluster(nodes, PEAKS[pk])
            b, f = price(text, model, cl, graphs), price(f8, model, cl, graphs)
            out.append((name, pk, b["tps"], f["tps"], pub_bf16, pub_fp8, src, f["gib"]))
    return out


def megatron_rows(only=""):
    """[(name, bf16 tok/s, fp8 tok/s, published fp8, source, fp8 peak GB, fits)]: each file imported as
    `sapp import --from megatron FILE --cluster C` does (the model its flags state), and without its FP8 flags."""
    from sapp import api
    from sapp.engines import import_config
    from sapp.engines.megatron_build import build
    out = []
    for name, path, spec, pub, src in MEGATRON:
        if only not in name:
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        bf16 = "\n".join(ln for ln in text.splitlines() if not ln.startswith(FP8_FLAGS))
        graph = api.capture_graph(build(text, path))[0]
        cl = api.resolve_cluster(spec)
        tps = []
        for t in (bf16, text):
            plan = import_config(t, "megatron", graph, cl, path, source=path)
            pr = plan["predicted"]
            tps.append(plan["model"]["global_batch"] * graph.meta["config"]["s"] / pr["step_time_s"] / cl.devices)
        out.append((name, tps[0], tps[1], pub, src, pr["peak_memory_bytes"] / 1e9,
                    pr["peak_memory_bytes"] <= cl.usable_memory))
    return out


def table(rs) -> str:
    lines = ["| row | peak | sapp bf16 | sapp FP8 | published compile+Float8 | FP8 err | sapp FP8/bf16 | "
             "published ratio | source |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, pk, b, f, pb, pf, src, _ in rs:
        lines.append(f"| {name} | {pk} | {b:,.0f} | {f:,.0f} | {pf:,} | {(f - pf) / pf:+.1%} | {f / b:.2f} | "
                     f"{pf / pb:.2f} | {src} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.published_fp8", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="rows whose name contains this text")
    args = ap.parse_args(argv)
    t0 = time.time()
    rs = rows(args.only)
    print(f"python -m bench.published_fp8  ({datetime.date.today()}, tokens/s/GPU)")
    print(table(rs))
    ms = megatron_rows(args.only)
    if ms:
        print("\n| Megatron-Core FP8 run | sapp bf16 | sapp FP8 (delayed) | published | FP8 err | peak GB | source |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for name, b, f, pub, src, gb, fits in ms:
            print(f"| {name} | {b:,.0f} | {f:,.0f} | {pub:,} | {(f - pub) / pub:+.1%} | {gb:.1f}"
                  f"{'' if fits else ' (does not fit)'} | {src} |")
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
