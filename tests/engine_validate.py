"""The engines' own configuration checks, fed with sapp's exports (tests/test_engines_validation.py).
Each helper builds what the engine builds from the file and lets the engine's code accept or raise.
The engines come from the `engines` extra (pyproject.toml); a missing one skips its test."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import types


def megatron(args_text: str):
    """Megatron-Core's ModelParallelConfig and TransformerConfig built from an argument file the way
    Megatron-LM's arguments.py (vpp from --num-layers-per-virtual-pipeline-stage) and
    core_transformer_config_from_args (same-named fields) do; their __post_init__ validates."""
    import torch
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    from sapp.engines.megatron import tokens
    a = tokens(args_text)

    def i(flag, default=None):
        return int(a[flag]) if flag in a else default
    L, pp = i("--num-layers"), i("--pipeline-model-parallel-size", 1)
    emb, loss = bool(a.get("--account-for-embedding-in-pipeline-split")), bool(a.get("--account-for-loss-in-pipeline-split"))
    vpp = None
    if "--num-layers-per-virtual-pipeline-stage" in a:
        vpp = (L + emb + loss) // pp // i("--num-layers-per-virtual-pipeline-stage")
    dtype = torch.bfloat16 if a.get("--bf16") else torch.float16 if a.get("--fp16") else torch.float32
    common = dict(tensor_model_parallel_size=i("--tensor-model-parallel-size", 1), pipeline_model_parallel_size=pp,
                  virtual_pipeline_model_parallel_size=vpp, sequence_parallel=bool(a.get("--sequence-parallel")),
                  context_parallel_size=i("--context-parallel-size", 1),
                  expert_model_parallel_size=i("--expert-model-parallel-size", 1),
                  expert_tensor_parallel_size=i("--expert-tensor-parallel-size"),
                  bf16=bool(a.get("--bf16")), fp16=bool(a.get("--fp16")), params_dtype=dtype, pipeline_dtype=dtype,
                  tp_comm_overlap=bool(a.get("--tp-comm-overlap")))
    mp = ModelParallelConfig(**common)
    gran = a.get("--recompute-granularity")
    tc = TransformerConfig(
        num_layers=L, hidden_size=i("--hidden-size"), num_attention_heads=i("--num-attention-heads"),
        ffn_hidden_size=i("--ffn-hidden-size"), num_query_groups=i("--num-query-groups"),
        num_moe_experts=i("--num-experts"), moe_router_topk=i("--moe-router-topk", 2),
        moe_ffn_hidden_size=i("--moe-ffn-hidden-size"),
        moe_shared_expert_intermediate_size=i("--moe-shared-expert-intermediate-size"),
        moe_shared_expert_gate=bool(a.get("--moe-shared-expert-gate")),
        moe_router_pre_softmax=bool(a.get("--moe-router-pre-softmax")),
        recompute_granularity=gran, recompute_method=a.get("--recompute-method"),
        recompute_num_layers=i("--recompute-num-layers"),
        recompute_modules=a["--recompute-modules"].split() if isinstance(a.get("--recompute-modules"), str) else None,
        moe_grouped_gemm=bool(a.get("--moe-grouped-gemm")),
        num_layers_in_first_pipeline_stage=i("--decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=i("--decoder-last-pipeline-num-layers"),
        account_for_embedding_in_pipeline_split=emb, account_for_loss_in_pipeline_split=loss,
        cp_comm_type=a.get("--cp-comm-type"), add_bias_linear=not a.get("--disable-bias-linear"),
        window_size=_pair(a.get("--window-size")),
        pipeline_model_parallel_layout=a.get("--pipeline-model-parallel-layout"),
        fp8=a.get("--fp8-format"), fp8_recipe=a.get("--fp8-recipe", "delayed"), **common)
    return mp, tc


def _pair(v):
    """Megatron-LM's tuple_type (arguments.py): "4095,0" or "(4095,0)" -> (4095, 0)."""
    return None if v is None else tuple(int(x) for x in str(v).strip("()").split(","))


def _torchtitan_package():
    """torchtitan's package without running its __init__, which imports its GPU kernels (triton, absent
    beside torch's CPU wheel); the config manager itself needs only tyro and tomllib."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            raise ImportError("torchtitan")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = pkg


def torchtitan(toml_path: str):
    """torchtitan's ConfigManager parsing the TOML as `--job.config_file` (it rejects unknown sections,
    keys and wrong types)."""
    _torchtitan_package()
    from torchtitan.config.manager import ConfigManager
    return ConfigManager().parse_args(["--job.config_file", str(toml_path)])


def torchtitan_text(text: str, folder):
    """`torchtitan` on a job TOML's text (written into `folder`), skipping the test where torchtitan 0.2.2
    (and tyro, which its ConfigManager needs) is not installed."""
    import pytest
    pytest.importorskip("tyro")
    path = os.path.join(str(folder), "job.toml")
    with open(path, "w") as f:
        f.write(text)
    try:
        return torchtitan(path)
    except ImportError:
        pytest.skip("torchtitan not installed")


class _DataParallel:
    """The one thing DeepSpeedConfig asks an mpu: the data-parallel world size."""

    def __init__(self, n):
        self.n = n

    def get_data_parallel_world_size(self):
        return self.n


def deepspeed(json_text: str, world: int):
    """DeepSpeed's config parser (batch arithmetic, ZeRO section via pydantic) at `world` data-parallel
    ranks.  It asks deepspeed.comm for this process's rank first (no process group here: rank 0 is
    answered for that one call) and the mpu for the data-parallel world size."""
    import os
    os.environ.setdefault("DS_BUILD_OPS", "0")
    from deepspeed.runtime import config as ds_config
    real = ds_config.dist.get_rank
    ds_config.dist.get_rank = lambda *a, **k: 0
    try:
        return ds_config.DeepSpeedConfig(json.loads(json_text), mpu=_DataParallel(world))
    finally:
        ds_config.dist.get_rank = real
