"""The fork server preloads a dataset's module found only through a path the script added at run time (as a
script's own directory is), so workers fork with it imported instead of importing it each."""

import os
import subprocess
import sys
import textwrap

# A dataset module that records which processes import it.
_MODULE = textwrap.dedent("""
    import os
    import numpy as np

    with open(os.environ["IMPORTED_BY"], "a") as f:
        f.write(f"{os.getpid()}\\n")

    class Numbers:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return np.full((2, 3), i, np.float32)
""")

# In a fresh interpreter: the fork server starts once per process, with the first loader's preloads.
_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.path.join(os.getcwd(), "lib"))  # not on the interpreter's own path
    os.chdir("/")  # nor is the directory the script was started in
    import numbers_dataset
    from kfast.data import FastLoader

    for _ in range(2):
        with FastLoader(numbers_dataset.Numbers(), workers=2, use_multiprocessing=True) as loader:
            assert [float(b[0, 0]) for b in loader] == [0, 1, 2, 3, 4, 5]
            workers = [p.pid for p in loader._stream._pool._processes]
            with open(f"/proc/{workers[0]}/stat") as f:
                server = int(f.read().rsplit(")", 1)[1].split()[1])
            print("workers", *workers, "server", server)
    # What the fork server needed is not left for other programs to inherit.
    print("inherited", sorted(key for key in os.environ if key.startswith("KFAST_MP_")))
""")


def test_the_fork_server_preloads_a_module_from_a_path_added_at_run_time(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "numbers_dataset.py").write_text(_MODULE)
    log = tmp_path / "imported_by.txt"
    env = {**os.environ, "IMPORTED_BY": str(log), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("workers")]
    workers = {int(p) for line in lines for p in line[1:3]}
    servers = {int(line[4]) for line in lines}
    importers = {int(p) for p in log.read_text().split()}
    # The script imported it, and the fork server (one, for both loaders) once; no worker did.
    assert len(lines) == 2 and len(workers) == 4 and len(servers) == 1
    assert not importers & workers, (importers, workers)
    assert servers <= importers and len(importers) == 2, (importers, servers)
    assert "inherited []" in proc.stdout
