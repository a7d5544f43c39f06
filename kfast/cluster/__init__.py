"""Where the ranks run: the hosts and slots of a `-H` list, a Slurm allocation or a host file, and Slurm batch
scripts.

`kfast launch` reads `-H` with `parse_host_list()`; when no `-H` is given, inside a Slurm job it takes the
allocation's hosts (`allocation()`), with `--hostfile` the file's (`read_hostfile()`, which also reads the MPI
Operator's).
"""

from kfast.cluster.batch_script import batch_script
from kfast.cluster.hostfile import read_hostfile
from kfast.cluster.hosts import parse_host_list
from kfast.cluster.nodelist import expand_counts, expand_nodelist
from kfast.cluster.slurm import Allocation, allocation, in_allocation

__all__ = ["Allocation", "allocation", "batch_script", "expand_counts", "expand_nodelist", "in_allocation", "parse_host_list",
           "read_hostfile"]
