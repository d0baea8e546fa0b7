"""Pipeline stages: the model traced and cut into stages (pipe.py), the repairs of the cut graph
(graph_fix.py, stage_local.py, stage_carry.py), schedules and tied weights."""
