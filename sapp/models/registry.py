"""Named model sizes and their builders.  GPT vocabularies are 51200: GPT-2's 50257 padded up to a
multiple of 1024 (as Megatron does) so vocab-parallel splits divide evenly on 2..1024 ways.
The builder modules import torch; they load on first use of BUILDERS, so the names and configs
(what a cached capture's key needs) come without it."""
import importlib

GPT_V = 51200
GPT_S = 2048


def _gpt(l, h, a, V=GPT_V, s=GPT_S):
    return {"l": l, "h": h, "a": a, "V": V, "s": s, "ffn": 4 * h, "dropout": 0.1, "tie_embeddings": False,
            "attn": "eager"}


def _bert(l, h, a, V=30522, s=512):
    return {"l": l, "h": h, "a": a, "V": V, "s": s, "ffn": 4 * h, "dropout": 0.1}


def _llama(l, h, a, kv, ffn, V=128256, s=8192):
    return {"l": l, "h": h, "a": a, "kv": kv, "V": V, "s": s, "ffn": ffn}


def _wd(rows_per_field=1_000_000, dim=80, deep=(1024, 512, 256), vocab=None):
    fields = 26
    if vocab is not None:
        rows_per_field = -(-vocab // fields)
    return {"rows_per_field": rows_per_field, "vocab": fields * rows_per_field, "dense": 13,
            "fields": fields, "dim": dim, "deep": tuple(deep), "sparse": True}


def _moe(l, h, a, kv, V, s, ffn, experts, top_k, expert_ffn, shared=0, dense=0, hd=None, capacity_factor=0.0,
         **extra):
    return {"l": l, "h": h, "a": a, "kv": kv, "V": V, "s": s, "ffn": ffn, "experts": experts, "top_k": top_k,
            "expert_ffn": expert_ffn, "shared": shared, "dense": dense, "hd": hd or h // a,
            "capacity_factor": capacity_factor, **extra}


# name -> (kind, default config).  Sizes follow the GPT-3 paper table (1.3B uses a=16, hd=128;
# 13B uses h=5120 so heads divide it); gpt-10b is a 48-layer h=4096 model (~10.1B parameters).
NAMED = {
    "gpt-tiny": ("gpt", _gpt(2, 64, 4, V=256, s=32)),
    "gpt-small": ("gpt", _gpt(4, 128, 4, V=512, s=64)),
    "gpt3-125m": ("gpt", _gpt(12, 768, 12)),
    "gpt3-350m": ("gpt", _gpt(24, 1024, 16)),
    "gpt3-760m": ("gpt", _gpt(24, 1536, 16)),
    "gpt3-1.3b": ("gpt", _gpt(24, 2048, 16)),
    "gpt3-2.7b": ("gpt", _gpt(32, 2560, 32)),
    "gpt3-6.7b": ("gpt", _gpt(32, 4096, 32)),
    "gpt-10b": ("gpt", _gpt(48, 4096, 32)),
    "gpt3-13b": ("gpt", _gpt(40, 5120, 40)),
    "gpt3-175b": ("gpt", _gpt(96, 12288, 96)),
    # Llama 3 shapes as Meta published them (rope theta 500000, RMSNorm eps 1e-5, seq 8192 in
    # pre-training; override s for the long-context phase, e.g. s=131072).
    "llama-tiny": ("llama", _llama(2, 64, 4, 2, 128, V=256, s=32)),
    "llama3-8b": ("llama", _llama(32, 4096, 32, 8, 14336)),
    "llama3-70b": ("llama", _llama(80, 8192, 64, 8, 28672)),
    "llama3-405b": ("llama", _llama(126, 16384, 128, 8, 53248)),
    "bert-tiny": ("bert", _bert(2, 64, 4, V=256, s=32)),
    "bert-base": ("bert", _bert(12, 768, 12)),
    "bert-large": ("bert", _bert(24, 1024, 16)),
    "resnet-tiny": ("resnet", {"layers": (1, 1, 1, 1), "width": 8, "classes": 10, "image": 32}),
    "resnet50": ("resnet", {"layers": (3, 4, 6, 3), "width": 64, "classes": 1000, "image": 224}),
    "wide-deep-tiny": ("widedeep", _wd(rows_per_field=100, dim=8, deep=(32, 16))),
    "wide-deep": ("widedeep", _wd()),
    "wide-deep-1m": ("widedeep", _wd(vocab=1_000_000)),
    "wide-deep-100m": ("widedeep", _wd(vocab=100_000_000)),
    "mlp-tiny": ("mlp", {"dims": (32, 64, 64), "classes": 10, "act": "relu"}),
    # 8 blocks of 1024 (9.4 M parameters): deep enough for the seed case's pipeline (pp 4, or
    # interleaved 2 x 4) beside recomputation and ZeRO
    "mlp": ("mlp", {"dims": (1024,) * 9, "classes": 1000, "act": "relu"}),
    # MoE (sapp/models/moe.py).  Mixtral-8x7B: 46.7B total, 12.9B active.  DeepSeek-V3-like: its 61
    # layers (3 dense, 58 MoE with 256 routed experts top-8 + 1 shared, expert ffn 2048), h 7168,
    # V 129280, but plain multi-head attention (128 heads of width 48: 176M parameters a layer, near
    # MLA's ~187M) instead of multi-head latent attention: 670.4B total, 36.9B active (671B / 37B).
    "moe-tiny": ("moe", _moe(2, 32, 4, 2, V=128, s=16, ffn=64, experts=4, top_k=2, expert_ffn=16, shared=1)),
    "mixtral-8x7b": ("moe", _moe(32, 4096, 32, 8, V=32000, s=4096, ffn=14336, experts=8, top_k=2,
                                 expert_ffn=14336)),
    "deepseek-v3-like": ("moe", _moe(61, 7168, 128, 128, V=129280, s=4096, ffn=18432, experts=256, top_k=8,
                                     expert_ffn=2048, shared=1, dense=3, hd=48)),
    # DeepSeek-V3 as its technical report (arXiv 2412.19437, sections 2.1 and 4.2) and HF config give it:
    # MLA (sapp/models/mla.py), group-limited routing over 8 groups, 4 kept (a token's experts on at most
    # 4 nodes under EP over 8 nodes), the dispatch sent in FP8 (section 3.3.2).  Its multi-token
    # prediction module and the sigmoid gating with bias are not modelled (softmax top-8 instead).
    "deepseek-v3": ("moe", _moe(61, 7168, 128, 128, V=129280, s=4096, ffn=18432, experts=256, top_k=8,
                                expert_ffn=2048, shared=1, dense=3, hd=128, n_group=8, topk_group=4,
                                dispatch_fp8=True,
                                mla={"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                                     "qk_rope_head_dim": 64, "v_head_dim": 128})),
}

# kind -> (module, class): BUILDERS[kind] is (class, param_count), imported when first asked for
_BUILDERS = {"gpt": ("gpt", "GPT"), "llama": ("llama", "Llama"), "bert": ("bert", "Bert"),
             "resnet": ("resnet", "ResNet"), "widedeep": ("widedeep", "WideDeep"), "mlp": ("mlp", "MLP"),
             "moe": ("moe", "MoEModel")}


class _Builders(dict):
    def __missing__(self, kind):
        mod_name, cls = _BUILDERS[kind]
        mod = importlib.import_module(f"{__package__}.{mod_name}")
        self[kind] = (getattr(mod, cls), mod.param_count)
        return self[kind]


BUILDERS = _Builders()
