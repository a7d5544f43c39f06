"""Several modes of train_script.py in one horovodrun job: python train_modes.py OUTDIR MODE [MODE ...].

Each mode runs as `python train_script.py MODE OUTDIR` would, one after the other in the same processes, and
writes what it writes there (OUTDIR/<mode>-rank<r>.json). tests/distributed/test_training.py starts this one
job for the checks that can share it, instead of one horovodrun start per mode: each start costs every rank a
TensorFlow and Horovod start-up, longer on this 2-core machine than most modes' training."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_script

import train_script  # noqa: E402 - needs the path above

if __name__ == "__main__":
    out, modes = sys.argv[1], sys.argv[2:]
    for mode in modes:
        sys.argv = [train_script.__file__, mode, out]
        train_script.main()
