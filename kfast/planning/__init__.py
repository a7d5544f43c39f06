"""Planning: how a model will scale over N ranks, and whether its training step fits a device.

`planner` measures the model and builds the `Plan`; `cost_model` holds the ring-allreduce and
parameter-server formulas; `link_probe` measures a link between two hosts; `plot` draws the plan. Memory:
`memory_model` predicts a device's breakdown (`activations` reads what the backward pass keeps from the
model's layers), `memory_fit` says whether it fits and what to change, `layouts` splits kernels over a
`(data, model)` mesh, `xla_memory` reads XLA's own analysis of the compiled step (JAX), and `memory`
puts them together for `Plan.memory`.
"""

from kfast.planning.layouts import propose_layout_map
from kfast.planning.memory import MemoryReport
from kfast.planning.memory import plan_memory
from kfast.planning.memory_fit import Change
from kfast.planning.memory_fit import MemoryFit
from kfast.planning.memory_fit import parse_memory
from kfast.planning.memory_model import MemoryBreakdown
from kfast.planning.memory_model import estimate_memory
from kfast.planning.planner import Plan
from kfast.planning.planner import plan
from kfast.planning.xla_memory import CompiledStepMemory
from kfast.planning.xla_memory import compiled_step_memory

__all__ = ["Change", "CompiledStepMemory", "MemoryBreakdown", "MemoryFit", "MemoryReport", "Plan",
           "compiled_step_memory", "estimate_memory", "parse_memory", "plan", "plan_memory", "propose_layout_map"]
