"""DeepSeek-V3's half of an HF decoder's architecture (sapp/engines/arch_hf.py): multi-latent attention,
the sigmoid router over groups with its score-correction bias, shared experts and dense first layers,
as transformers 5's DeepseekV3 modeling builds them and Megatron-Core (core_v0.16.1) states them:

  attention   q = q_b(norm(q_a(x))) (q_a absent when q_lora_rank is None), per head qk_nope_head_dim +
              qk_rope_head_dim wide; k/v from one latent: kv_a(x) -> kv_lora_rank + qk_rope_head_dim, the
              latent normed and lifted by kv_b to qk_nope_head_dim + v_head_dim per head
              (--multi-latent-attention --q-lora-rank --kv-lora-rank --qk-head-dim --qk-pos-emb-head-dim
              --v-head-dim; the latent norms are Megatron's q/kv layernorms: --qk-layernorm);
  rope        plain rope on the rope channels (--rope-type rope); yarn is refused (its mscale and
              correction range are not checked against HF's here);
  routing     sigmoid scores, top-k with the bias added for the choice only, experts grouped (n_group) and
              topk_group groups kept by the sum of their top-2 scores, the k weights renormalised and scaled by
              routed_scaling_factor (--moe-router-score-function sigmoid --moe-router-enable-expert-bias
              --moe-router-num-groups --moe-router-group-topk --moe-router-topk-scaling-factor; Megatron sums
              the top topk // group_topk scores of a group, so groups are stated only where that is 2)."""
from __future__ import annotations

from .mapping import EngineError


def deepseek_v3(path, cfg, layers) -> dict:
    """The MLA and MoE keys of DeepSeek-V3's architecture; EngineError names the field Megatron cannot state."""
    rp = getattr(cfg, "rope_parameters", None) or {}
    if isinstance(rp, dict) and rp.get("rope_type", "default") != "default":
        raise EngineError(f"{path}: rope_parameters.rope_type {rp.get('rope_type')!r} with multi-latent attention: "
                          f"sapp states Megatron's MLA with plain rope only (--rope-type rope); export to deepspeed")
    k, E, groups, keep = int(cfg.num_experts_per_tok), int(cfg.n_routed_experts), cfg.n_group or 1, cfg.topk_group or 1
    if not cfg.norm_topk_prob and k > 1:
        raise EngineError(f"{path}: norm_topk_prob false: Megatron-Core renormalises the top-k sigmoid scores; "
                          f"export to deepspeed")
    if groups > 1 and (E % groups or k // keep != 2 or keep > groups):
        raise EngineError(f"{path}: n_group {groups} / topk_group {keep} with num_experts_per_tok {k}: transformers "
                          f"keeps groups by their top-2 scores, Megatron-Core by their top num_experts_per_tok // "
                          f"topk_group ({k // keep}); export to deepspeed")
    dense = int(cfg.first_k_dense_replace)
    if dense >= layers:
        raise EngineError(f"{path}: first_k_dense_replace {dense} leaves no MoE layer; export to deepspeed")
    out = dict(mla=dict(q_lora=int(cfg.q_lora_rank) if cfg.q_lora_rank else None, kv_lora=int(cfg.kv_lora_rank),
                        nope=int(cfg.qk_nope_head_dim), rope=int(cfg.qk_rope_head_dim), v=int(cfg.v_head_dim)),
               experts=E, top_k=k, expert_ffn=int(cfg.moe_intermediate_size),
               shared_ffn=int(cfg.n_shared_experts or 0) * int(cfg.moe_intermediate_size), dense_layers=dense,
               score="sigmoid", expert_bias=True, topk_scale=float(cfg.routed_scaling_factor))
    if groups > 1:
        out.update(groups=int(groups), group_topk=int(keep))
    return out


def attention_params(a: dict, norm: int) -> int:
    """One MLA layer's attention parameters with its two block norms (`norm`: one norm's parameters per
    channel of width hidden, 1 for RMSNorm): the projections above and the latent norms."""
    m, h, H = a["mla"], a["hidden"], a["heads"]
    qk = m["nope"] + m["rope"]
    q = h * m["q_lora"] + norm * m["q_lora"] + m["q_lora"] * H * qk if m["q_lora"] else h * H * qk
    kv = h * (m["kv_lora"] + m["rope"]) + norm * m["kv_lora"] + m["kv_lora"] * H * (m["nope"] + m["v"])
    return q + kv + H * m["v"] * h + 2 * norm * h


def megatron_args(a: dict) -> list:
    """The Megatron flags of the MLA and routing keys (see the module doc)."""
    m = a["mla"]
    out = ["--multi-latent-attention", "--qk-layernorm", "--rope-type rope", f"--kv-lora-rank {m['kv_lora']}",
           f"--qk-head-dim {m['nope']}", f"--qk-pos-emb-head-dim {m['rope']}", f"--v-head-dim {m['v']}"]
    if m["q_lora"]:
        out.append(f"--q-lora-rank {m['q_lora']}")
    out += ["--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias",
            f"--moe-router-topk-scaling-factor {a['topk_scale']:g}"]
    if a.get("groups"):
        out += [f"--moe-router-num-groups {a['groups']}", f"--moe-router-group-topk {a['group_topk']}"]
    return out
