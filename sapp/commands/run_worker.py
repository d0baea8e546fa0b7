"""One rank of `sapp run`, as torchrun starts it:  python -m sapp.commands.run_worker PLAN --model NAME ...

The worker itself is sapp/emit/runtime/worker.py.  It sits in the emitter, below the search, so this
entry (above both) hands it the two things of the search it needs: sapp.api.reprice_as_run for a program
that differs from its plan (--allow-mismatch) and sapp.api.replan.replan for a group of another size
(--elastic).  Each is imported when first called, as the worker imported them before: a rank that needs
neither loads no search."""
from __future__ import annotations

import sys


def _reprice(model, plan) -> dict:
    from ..api import reprice_as_run
    return reprice_as_run(model, plan)


def _replan(model, plan, cluster, **kwargs):
    from sapp.api.replan import replan
    return replan(model, plan, cluster, **kwargs)


def main(argv=None) -> int:
    from ..emit.runtime import worker
    return worker.main(argv, reprice=_reprice, replan=_replan)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:       # Ctrl-C reaches every rank: `sapp run` says it in one line
        sys.exit(130)
