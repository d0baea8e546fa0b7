"""Plans people can read: `explain(plan)`, `diff(a, b)`, `plot(plan, path)`, and a terminal
`Progress` line for long searches.  Every function takes a Plan, a plan dict or a plan file path."""
from .diff import diff, layout_changes
from .explain import binding_constraint, explain, time_breakdown
from .plot import plot
from .progress import Progress
from .timeline import Event, plan_timeline, simulate_schedule

__all__ = ["explain", "diff", "plot", "Progress", "Event", "plan_timeline", "simulate_schedule",
           "binding_constraint", "time_breakdown", "layout_changes"]
