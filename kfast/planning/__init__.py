"""Planning: how a model will scale over N ranks, predicted from this machine's measurements.

`planner` measures the model and builds the `Plan`; `cost_model` holds the ring-allreduce and
parameter-server formulas; `link_probe` measures a link between two hosts; `plot` draws the plan.
"""

from kfast.planning.planner import Plan
from kfast.planning.planner import plan

__all__ = ["Plan", "plan"]
