"""The running program and `sapp run`'s worker: Program (program.py), the worker and its launcher,
process groups, data, checkpoints, logs, failure reports, the memory meter."""
