"""Data-parallel training with Horovod on Keras 3: topology, collectives, resuming and standard callbacks.

`kfast.distributed._horovod` holds Horovod and the collectives (the only module that imports Horovod);
`optimizer` averages gradients across ranks (`DistributedOptimizer`); `checkpoint` saves and restores
training state; `preemption` stops every rank at the same step on a signal; `defaults` assembles the standard callbacks; `elastic`
and `elastic_loop` keep a job training while ranks leave and join.
"""

from kfast.distributed._horovod import allgather_object
from kfast.distributed._horovod import allreduce_average
from kfast.distributed._horovod import allreduce_mean_values
from kfast.distributed._horovod import allreduce_sum_values
from kfast.distributed._horovod import broadcast_object
from kfast.distributed._horovod import broadcast_variables
from kfast.distributed._horovod import horovodrun_path
from kfast.distributed._horovod import init
from kfast.distributed._horovod import is_chief
from kfast.distributed._horovod import is_initialized
from kfast.distributed._horovod import local_rank
from kfast.distributed._horovod import local_size
from kfast.distributed._horovod import rank
from kfast.distributed._horovod import size
from kfast.distributed._horovod import verbose
from kfast.distributed.checkpoint import restore
from kfast.distributed.defaults import callbacks
from kfast.distributed.defaults import default_callbacks
from kfast.distributed.elastic_loop import elastic_fit
from kfast.distributed.optimizer import DistributedOptimizer
from kfast.distributed.preemption import RESUMABLE_EXIT
from kfast.distributed.preemption import Preempted
from kfast.distributed.steps import UnequalStepsError

__all__ = ["RESUMABLE_EXIT", "DistributedOptimizer", "Preempted", "UnequalStepsError", "allgather_object", "allreduce_average", "allreduce_mean_values",
           "allreduce_sum_values", "broadcast_object", "broadcast_variables", "callbacks", "default_callbacks",
           "elastic_fit", "horovodrun_path", "init", "is_chief", "is_initialized", "local_rank", "local_size", "rank",
           "restore", "size", "verbose"]
