"""Planning: how a model will scale over N ranks, and whether its training step fits a device.

`planner` measures the model and builds the `Plan`; `cost_model` holds the ring-allreduce and
parameter-server formulas; `link_probe` measures a link between two hosts; `plot` draws the plan. Memory:
`memory_model` predicts a device's breakdown (`activations` reads what the backward pass keeps from the
model's layers), `memory_fit` says whether it fits and what to change, `layouts` splits kernels over a
`(data, model)` mesh, `xla_memory` reads XLA's own analysis of the compiled step (JAX), and `memory`
puts them together for `Plan.memory`. For a GPU this machine lacks: `gpus` names the GPUs XLA describes,
`deviceless` compiles for one without it, `step_variants` carries a step (and its changes) to a JAX process
(`_compile_process`, driven by `gpu_compile`), `device_memory` gives the verdict with the runtime's margin and
the changes compiled, and `estimate` is `estimate_memory`'s front door.
"""

from kfast.planning.deviceless import GpuCompileUnavailable
from kfast.planning.device_memory import CompiledChange
from kfast.planning.device_memory import DeviceMemory
from kfast.planning.device_memory import RuntimeMargin
from kfast.planning.estimate import estimate_memory
from kfast.planning.gpus import GpuSpec
from kfast.planning.gpus import gpu_spec
from kfast.planning.gpus import known_gpus
from kfast.planning.layouts import propose_layout_map
from kfast.planning.memory import MemoryReport
from kfast.planning.memory import plan_memory
from kfast.planning.memory_fit import Change
from kfast.planning.memory_fit import MemoryFit
from kfast.planning.memory_fit import parse_memory
from kfast.planning.memory_model import MemoryBreakdown
from kfast.planning.planner import Plan
from kfast.planning.planner import plan
from kfast.planning.xla_memory import CompiledStepMemory
from kfast.planning.xla_memory import compiled_step_memory

__all__ = ["Change", "CompiledChange", "CompiledStepMemory", "DeviceMemory", "GpuCompileUnavailable", "GpuSpec",
           "MemoryBreakdown", "MemoryFit", "MemoryReport", "Plan", "RuntimeMargin", "compiled_step_memory",
           "estimate_memory", "gpu_spec", "known_gpus", "parse_memory", "plan", "plan_memory", "propose_layout_map"]
