"""kfast's collectives through the router on the Horovod engine (tests/distributed/test_horovod_collectives.py),
under `horovodrun -np 2`: each rank prints one REPORT line of what it got."""

import json
import signal

import kfast
from kfast.distributed import collectives
from kfast.distributed.preemption import PreemptionWatch

kfast.distributed.init()
rank = kfast.distributed.rank()
report = {"rank": rank, "size": kfast.distributed.size(), "initialized": kfast.distributed.is_initialized(),
          "broadcast": kfast.distributed.broadcast_object(("from", rank, b"x" * (10 + rank)), root_rank=1),
          "maximum": collectives.allreduce_max_ints([5 * rank, 7 - rank, -rank])}
try:
    kfast.distributed.broadcast_object(None, root_rank=2)
except ValueError as e:
    report["bad_root"] = str(e)
# The vote without a DistributedOptimizer (its own collective): a signal noted on rank 1 stops both at vote 2.
watch = PreemptionWatch((signal.SIGTERM,), 60, lambda: None, "")
watch.start()
votes = [watch.agree()]
if rank == 1:
    watch._noted(signal.SIGTERM)  # what signal_handling calls as SIGTERM arrives
votes.append(watch.agree())
watch.stop(redeliver=False)
report["votes"] = votes
print("REPORT " + json.dumps(report, default=repr), flush=True)
