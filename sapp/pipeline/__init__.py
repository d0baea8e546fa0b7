"""Pipeline parallelism: contiguous stage partition (partition.py), the schedule simulator and closed
forms (schedule.py), and per-unit stage costs from the cost model (profile.py)."""
from .partition import partition_counts, partition_dp
from .schedule import SCHEDULES, Event, SimResult, in_flight, simulate, stage_totals, step_time

partition = partition_dp

__all__ = ["partition", "partition_dp", "partition_counts", "simulate", "step_time", "in_flight",
           "stage_totals", "SCHEDULES", "Event", "SimResult"]
