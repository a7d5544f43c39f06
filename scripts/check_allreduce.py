"""A real two-process Horovod allreduce whose result is known exactly.

    python scripts/check_allreduce.py --launch   # starts itself under horovodrun -np 2 --gloo
    horovodrun -np 2 -H localhost:2 --gloo python scripts/check_allreduce.py

Rank r contributes [r + 1, 10 * (r + 1)]; the summed allreduce over n ranks must equal
[n(n+1)/2, 10 n(n+1)/2] on every rank. Each rank prints one line; the process exits non-zero on a mismatch.
"""

import os
import shutil
import subprocess
import sys


def launch(np=2, timeout=180):
    horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", str(np), "-H", f"localhost:{np}", "--gloo", sys.executable, os.path.abspath(__file__)]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, timeout=timeout).returncode


def check():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = hvd.allreduce(tf.constant([r + 1.0, 10.0 * (r + 1)]), op=hvd.Sum).numpy().tolist()
    expected = [n * (n + 1) / 2, 10 * n * (n + 1) / 2]
    ok = total == expected
    print(f"rank {r}/{n}: allreduce sum {total}, expected {expected}: {'OK' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(launch() if "--launch" in sys.argv else check())
