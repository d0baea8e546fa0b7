"""torchtitan 0.3's own ConfigManager loading a `sapp export --to torchtitan` file the way
`torchtitan.train --module M --config F` does (it imports the module and calls the function: run this
only on files sapp wrote), then Trainer.Config's own checks; prints the fields sapp priced.  Run by hand
where torchtitan 0.3 imports (not the pinned 0.2.2 of the `engines` extra):

    PYTHONPATH=<torchtitan 0.3>:<dir of sapp_job.py> SAPP_STUB_ASYNC_EP=1 python bench/torchtitan_fields/accept.py sapp_job GPUS"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(module, world):
    if os.environ.get("SAPP_STUB_ASYNC_EP"):
        from extract import _stub
        _stub()
    from torchtitan.config import ConfigManager
    cfg = ConfigManager().parse_args(["--module", module, "--config", module])
    par, tr = cfg.parallelism, cfg.training
    from torchtitan.distributed import ParallelDims
    dims = ParallelDims.from_config(par, world)          # its degree checks against the world size
    print(f"model {cfg.model_spec.name} {cfg.model_spec.flavor}; tp {par.tensor_parallel_degree} sp "
          f"{par.enable_sequence_parallel} pp {par.pipeline_parallel_degree} {par.pipeline_parallel_schedule} "
          f"cp {par.context_parallel_degree} ep {par.expert_parallel_degree} replicate "
          f"{par.data_parallel_replicate_degree} shard {par.data_parallel_shard_degree} reshard "
          f"{par.fsdp_reshard_after_forward}; local batch {tr.local_batch_size} global {tr.global_batch_size} seq "
          f"{tr.seq_len} microbatch {par.pipeline_parallel_microbatch_size}; AC "
          f"{type(cfg.activation_checkpoint).__qualname__}; param {tr.mixed_precision_param} reduce "
          f"{tr.mixed_precision_reduce}; optimizer {cfg.optimizer.param_groups[0].optimizer_name}; ParallelDims "
          f"dp_shard {dims.dp_shard} of {world} GPUs")
    # the attention kernel the model runs and whether the step is captured as a CUDA graph
    from torchtitan.models.common.config_utils import VarlenAttention
    kinds = {type(c).__qualname__ for _, c, _, _ in cfg.model_spec.model.traverse(VarlenAttention.Config)}
    print(f"attention {', '.join(sorted(kinds)) or 'not varlen'}; CUDA graphs "
          f"{'off' if tr.disable_cuda_graphs else 'on'}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
