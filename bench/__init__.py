"""sapp benchmarks.  `python -m bench [--quick]` runs the model zoo x clusters x device counts against
baselines (bench/run.py); the other modules are individual studies (search quality and speed, joint
search, placement, capture speed, calibration accuracy)."""
