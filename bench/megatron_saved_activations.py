"""What one Megatron-Core transformer layer saves for backward, measured with Megatron-Core's own code on
a CPU, beside sapp's activation price for the same layer: `python -m bench.megatron_saved_activations`
(megatron-core 0.16.1 without Transformer Engine or Apex; 17 s on the CPU box; `--json` for the figures).

Megatron's side.  One layer (a TransformerBlock of one layer, so full recomputation runs as Megatron
runs it) built from `get_gpt_layer_local_spec` in a world of one (gloo, initialize_model_parallel(1, 1)),
bf16 parameters and activations, s = 128, mbs = 2, h = 256, 8 heads:
  - dense GPT: LayerNorm, biases, GELU, ffn 4h, 8 kv groups (MHA);
  - Llama: RMSNorm, no biases, SwiGLU, ffn 3.5h, 2 kv groups (GQA), RoPE (unfused on a CPU);
  - MoE (Mixtral): the Llama layer with 8 experts, top-2 (expert ffn 3.5h), SequentialMLP (the local
    GroupedMLP needs the grouped_gemm package, not installed), the allgather dispatcher ("moe") or the
    Mixtral example's alltoall ("moe-alltoall": its constructor makes a torch.cuda.Stream and its
    forward syncs split sizes on it; an inert stream stands in, ep 1 sends nothing).
Megatron's argument defaults for the fused bias-GeLU / bias-SwiGLU kernels (autograd Functions: what
they save is what a GPU saves), dropout 0 (the Mixtral example's).  What backward keeps is
read with torch.autograd.graph.saved_tensors_hooks during one forward, each storage once, parameters
excluded, each tensor attributed to the innermost module running when it was saved.  CPU shims, none of
them touching what is saved: torch.cuda.current_device answers "cpu" (the MoE router moves its gate
there, DotProductAttention's baddbmm scratch is made there); the model-parallel RNG tracker forks the
CPU generator; the causal mask and the rotary table are passed in (Megatron makes both on "cuda");
moe_utils.te_general_gemm is set to None, the fallback its router tests for (0.16.1 never defines the
name without Transformer Engine: a NameError); the fused point-wise kernels run their math eagerly
(torch.compile off); one inert CUDA stream for the alltoall dispatcher.

A CPU runs Megatron's local DotProductAttention, which keeps the s x s scores (fp32 softmax output and
its bf16 copy); a GPU runs flash attention (TE / cuDNN), which keeps q, k, v, the output and an fp32
log-sum-exp.  So the layer is compared as it is with everything but what core attention keeps *inside*
itself, i.e. the layer measured with selective recomputation of core_attn (Megatron then keeps only
the core's inputs q, k, v: what flash attention keeps too, less its b·a·s fp32 log-sum-exp).

sapp's side.  The zoo model of the same shape (GPT with SDPA attention / Llama / MoEModel), captured,
every op unsplit on one device, priced under the "fused" runtime (Megatron's: every float activation
bf16) by pipeline.profile.unit_activations: (none, selective, full) bytes of one block.  sapp's zoo
attention is SDPA (flash), so its "none" is the flash-attention layer: compared with Megatron's
selective figure.  Coefficient = bytes per token per layer / h ("sbh" units).

Reading the figures (bench/RESULTS.md §19):
- "Flash-equivalent" is the layer with selective recomputation of `core_attn`: a CPU runs Megatron's local
  DotProductAttention, which keeps the scores (24-24.5 sbh more here: fp32 softmax and its bf16 copy), while
  a GPU's flash attention keeps the core's inputs, what the checkpointed core keeps too (less flash's fp32
  log-sum-exp, 4a/h).  The norms are shown apart: a CPU's torch RMSNorm keeps an fp32 copy (8 sbh a norm),
  the fused kernel the bf16 input and an fp32 1/rms (2 + 4/h), which sapp prices as 2.
- What the "fused" runtime prices as Megatron-Core's kernels keep it (sapp/costmodel/fusion.py, found
  from the graph; `pytest tests/test_fused_saves.py`, 7 passed in 7 s):
  - the bias-SwiGLU kernel keeps only its input [gate | up] and recomputes silu in backward;
  - flash attention returns the [s, b, h] layout the output projection reads: one tensor, where sapp's
    zoo attention makes a (b, s, h) copy (2 sbh);
  - flash attention reads k and v at their kv heads: the expand + reshape copy an eager GQA model makes
    for every query head is not kept (1.5 sbh each here, kv 1 head in 4);
  - Megatron's v is a view of the fused q/k/v projection; where rotary made q and k new tensors, that
    view keeps the whole projection alive (3 sbh here against v's 0.5), and v is priced so;
  - the routing weights are applied inside the SwiGLU (weighted_bias_swiglu), so the gathered expert
    outputs are not kept for their gradient (4 sbh).
  The remaining -0.25 sbh of attention: Megatron's unfused rotary code keeps a bf16 cos and sin table for
  q and again for k.  The zoo's Mixtral-like MoE attention is rotary, as the models it stands for.
- Under cp the fused profile's own k and v (grouped, un-repeated) are what a rank trades for the
  gathered ones (sapp/search/joint/cp.py `kv_saved_per_sample`), not the repeated copies.
- A plan the search packs to the edge of memory can outgrow it once conformed to Megatron (its equal
  middle stages, its "full on the first N layers"): `sapp search --target megatron` then searches again
  with what conforming added held back from usable memory (sapp/engines/__init__.py `best_plan`;
  `pytest tests/test_engines_best_plan.py`).  Llama-3-70B with cp 2 on 128 H100s: the first plan
  conformed to 77.80 GB of 77.60 usable (+2.0 GB); searched again, tp 2 pp 4, 62.32 s/step at 75.35 GB
  (70.2 GiB), where the uniform-recomputation fallback gives 68.04 s.

bench/RESULTS.md §19's layer: bf16, s 128, mbs 2, h 256, 8 heads.  Applied to Megatron's Mixtral
example (§16): main's estimate with its per-layer term replaced by the measured MoE layer (62.46 sbh
against the formula's 34) gives 51.5 GiB, sapp -5.6% from it."""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import sys
import tempfile
import warnings

S, B, H, HEADS = 128, 2, 256, 8
KINDS = ("gpt", "llama", "moe", "moe-alltoall")
RECOMPUTE = ("none", "selective", "full")
_READY = {}


def blocked() -> str | None:
    """Why megatron-core cannot be measured here (None: it can)."""
    try:
        import megatron.core  # noqa: F401
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: F401
    except Exception as e:          # not installed, or broken
        return f"megatron.core does not import: {type(e).__name__}: {e}"
    return None


def _init():
    """A world of one: gloo process group, model parallelism 1 x 1, and the CPU shims (module text).
    They change process-wide state (torch.cuda.current_device, dynamo off, a process group): run this
    in a process of its own (`main`; tests/test_megatron_saved_activations.py starts one)."""
    if _READY:
        return
    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore")
    if not dist.is_initialized():
        store = tempfile.NamedTemporaryFile(prefix="sapp_mcore_", delete=False).name
        atexit.register(lambda: os.path.exists(store) and os.unlink(store))
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mrandom
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)
    # the CUDA RNG tracker forks the CPU generator instead (dropout draws from it; nothing it saves changes)
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    tracker = mrandom.get_cuda_rng_tracker()
    for name in (mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME,
                 mrandom._DATA_PARALLEL_RNG_TRACKER_NAME):
        tracker.states_.setdefault(name, torch.get_rng_state())
    tracker._is_initialized = True
    # modules that move their weights or scratch tensors to torch.cuda.current_device() (the MoE router's
    # gate, its aux-loss scalars, DotProductAttention's baddbmm scratch) keep them on the CPU
    torch.cuda.current_device = lambda: "cpu"
    # the fused point-wise kernels (bias-SwiGLU, bias-GeLU, bias-dropout-add: autograd Functions whose
    # save_for_backward is what is measured) run their math eagerly, not through torch.compile
    import torch._dynamo
    torch._dynamo.config.disable = True
    # the alltoall dispatcher moves its split sizes to the host on a side stream: one inert stream
    # (current and side alike, so nothing waits), its context and event doing nothing
    stream = _Stream()
    torch.cuda.Stream = lambda *a, **k: stream
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    # without Transformer Engine moe_utils never defines te_general_gemm, which the router's gating
    # linear tests against None (a NameError in 0.16.1): the name its own fallback expects
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    _READY["ps"] = ps


class _Stream:
    def wait_stream(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def record_event(self, *a, **k):
        return self


def config(kind: str, recompute: str = "none", dropout: float = 0.0, fused: bool = True):
    """The TransformerConfig of one layer of `kind` (module text)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig
    common = dict(num_layers=1, hidden_size=H, num_attention_heads=HEADS, hidden_dropout=dropout,
                  attention_dropout=dropout, bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=True,
                  bias_activation_fusion=fused, bias_dropout_fusion=fused, masked_softmax_fusion=False,
                  apply_rope_fusion=False)
    if recompute == "selective":
        common.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    elif recompute == "full":
        common.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if kind == "gpt":
        return TransformerConfig(ffn_hidden_size=4 * H, normalization="LayerNorm", add_bias_linear=True,
                                 activation_func=F.gelu, **common)
    llama = dict(ffn_hidden_size=7 * H // 2, num_query_groups=2, gated_linear_unit=True, activation_func=F.silu,
                 normalization="RMSNorm", add_bias_linear=False, **common)
    if kind == "llama":
        return TransformerConfig(**llama)
    dispatcher = "alltoall" if kind == "moe-alltoall" else "allgather"
    return TransformerConfig(num_moe_experts=8, moe_router_topk=2, moe_token_dispatcher_type=dispatcher,
                             moe_grouped_gemm=False, moe_ffn_hidden_size=7 * H // 2,
                             moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2, **llama)


def build(kind: str, recompute: str = "none", dropout: float = 0.0, fused: bool = True):
    """(TransformerBlock of one layer, its config)."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlock
    _init()
    torch.manual_seed(0)
    cfg = config(kind, recompute, dropout, fused)
    spec = get_gpt_layer_local_spec(num_experts=8 if kind.startswith("moe") else None, moe_grouped_gemm=False,
                                    normalization=cfg.normalization)
    block = TransformerBlock(cfg, spec, post_layer_norm=False)
    return block.train(), cfg


class _Saved:
    """Storages packed for backward during a forward, each once, by the innermost module saving it."""

    def __init__(self, model, shared=()):
        # parameters, and what every layer of a model shares (the mask, the rotary table) are not a layer's
        self.params = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *shared]}
        self.held, self.by_part, self.stack, self.hooks = {}, {}, [], []
        for name, m in model.named_modules():
            self.hooks.append(m.register_forward_pre_hook(lambda mod, a, n=name: (self.stack.append(n), None)[1]))
            self.hooks.append(m.register_forward_hook(lambda mod, a, o: (self.stack.pop(), None)[1]))

    def pack(self, t):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in self.params and key not in self.held:
            self.held[key] = t                          # kept alive: no pointer reuse during the forward
            part = self.stack[-1] if self.stack else "(outside)"
            self.by_part[part] = self.by_part.get(part, 0) + st.nbytes()
        return t

    def close(self):
        for h in self.hooks:
            h.remove()


def measure(kind: str, recompute: str = "none", dropout: float = 0.0, fused: bool = True) -> dict:
    """{"total": bytes one layer saves for one micro-batch, "parts": {module: bytes}, "coef": total / (s·b·h)}."""
    import torch
    block, cfg = build(kind, recompute, dropout, fused)
    torch.manual_seed(1)
    x = torch.randn(S, B, H, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)[None, None]
    rope = None
    if kind != "gpt":
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        rot = RotaryEmbedding(kv_channels=H // HEADS, rotary_percent=1.0, rotary_base=1000000,
                              use_cpu_initialization=True)
        freqs = rot.get_freqs_non_repeated(S)          # get_emb without its move of inv_freq to "cuda"
        rope = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    saved = _Saved(block, shared=[mask] + ([rope] if rope is not None else []))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        out = block(x, attention_mask=mask, rotary_pos_emb=rope)
    saved.close()
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()                        # the forward is a real training one
    total = sum(saved.by_part.values())
    return {"total": total, "parts": dict(sorted(saved.by_part.items())), "coef": total / (S * B * H)}


def zoo_model(kind: str):
    """sapp's zoo module of the same layer shape (two layers; layer 1 is priced), meta device."""
    import torch
    from sapp.models.gpt import GPT
    from sapp.models.llama import Llama
    from sapp.models.moe import MoEModel
    with torch.device("meta"):
        if kind == "gpt":
            return GPT(2, H, HEADS, 512, S, ffn=4 * H, dropout=0.0, attn="sdpa")
        if kind == "llama":
            return Llama(2, H, HEADS, 2, 512, S, 7 * H // 2)
        return MoEModel(2, H, HEADS, 2, 512, S, 7 * H // 2, experts=8, top_k=2, expert_ffn=7 * H // 2)


def sapp_price(kind: str, runtime: str = "fused") -> dict:
    """sapp's (none, selective, full) bytes of layer 1 of the zoo model at batch B, one device, bf16,
    `runtime`, with each node's share {node: bytes} of "none"."""
    import torch
    from sapp.api import capture_graph
    from sapp.cluster import PRESETS
    from sapp.costmodel import CostSettings, first_savers, saved_items
    from sapp.cluster.mesh import Mesh
    from sapp.pipeline.profile import unit_activations
    g, _ = capture_graph(zoo_model(kind), (torch.zeros(B, S, dtype=torch.long, device="meta"),))
    st = CostSettings(precision="bf16-mixed", runtime=runtime)
    mesh = Mesh.for_devices(PRESETS["cpu"], 1)
    strat = {n: () for n in g.nodes}
    block = [n for n, nd in g.nodes.items() if (nd.module or "").startswith("layers.1.") or nd.module == "layers.1"]
    savers = first_savers(g, mesh, st)
    none, sel, full = unit_activations(g, block, strat, mesh, st, savers)
    nodes = {}
    for n in block:
        for tid, b in saved_items(g.nodes[n], (), mesh, st):
            if savers.get(tid) == n:
                key = f"{g.nodes[n].module}:{n}"
                nodes[key] = nodes.get(key, 0) + b
    return {"none": none, "selective": sel, "full": full, "nodes": nodes}


def _groups(parts: dict, prefix: str) -> dict:
    """{"norms", "attention", "mlp"} bytes of one layer's parts (module paths under `prefix`)."""
    out = {"norms": 0.0, "attention": 0.0, "mlp": 0.0}
    for name, b in parts.items():
        rest = name[len(prefix):] if name.startswith(prefix) else name
        if rest.startswith(("input_layernorm", "pre_mlp_layernorm", "ln")):
            out["norms"] += b
        elif rest.startswith(("self_attention", "attn")):
            out["attention"] += b
        elif rest.startswith(("mlp", "moe")):
            out["mlp"] += b
        else:
            raise ValueError(f"unattributed saved tensor in {name}")
    return out


def compare(kind: str) -> dict:
    """sbh coefficients by part, Megatron measured and sapp priced (fused runtime)."""
    tok = S * B * H
    none, sel, full = (measure(kind, r) for r in RECOMPUTE)
    meg = {k: v / tok for k, v in _groups(sel["parts"], "layers.0.").items()}
    price = sapp_price(kind)
    sap = {k: v / tok for k, v in _groups(price["nodes"], "layers.1.").items()}
    meg["total"], sap["total"] = sel["total"] / tok, price["none"] / tok
    meg["core_cpu"], sap["core_cpu"] = (none["total"] - sel["total"]) / tok, (price["none"] - price["selective"]) / tok
    meg["full"], sap["full"] = full["total"] / tok, price["full"] / tok
    for d in (meg, sap):
        d["less_norms"] = d["total"] - d["norms"]
    return {"megatron": meg, "sapp": sap}


ROWS = (("mlp", "MLP / MoE (router, permutation, experts)"), ("attention", "attention less its core"),
        ("norms", "the two norms"), ("total", "layer, flash-equivalent"), ("less_norms", "that less the norms"),
        ("full", "full recomputation"), ("core_cpu", "core attention's inside (CPU kernel)"))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.megatron_saved_activations", description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--json", action="store_true", help="print {kind: compare(kind)} as JSON")
    a = p.parse_args(argv)
    why = blocked()
    if why:
        print(why)
        return 2
    if a.json:
        print(json.dumps({kind: compare(kind) for kind in a.kinds.split(",")}, sort_keys=True))
        return 0
    print(f"s={S} mbs={B} h={H} heads={HEADS}, bf16; bytes per token per layer / h")
    print("| layer | part | Megatron-Core measured | sapp priced (fused) | error |")
    print("|---|---|---|---|---|")
    for kind in a.kinds.split(","):
        r = compare(kind)
        for key, label in ROWS:
            m, s = r["megatron"][key], r["sapp"][key]
            err = f"{(s / m - 1) * 100:+.1f}%" if m else "—"
            print(f"| {kind} | {label} | {m:.2f} | {s:.2f} | {err} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    with contextlib.redirect_stderr(open(os.devnull, "w")):
        sys.exit(main())
