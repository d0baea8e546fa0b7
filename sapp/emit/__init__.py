"""Plan -> running torch.distributed training program.  `emit(model, plan)` builds this rank's part;
`sapp run` (sapp/commands/run.py) launches one process per device with torchrun and runs
sapp/emit/worker.py in each."""
from .program import Program, emit

__all__ = ["emit", "Program"]
