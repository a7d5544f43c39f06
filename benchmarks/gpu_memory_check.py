"""Is XLA's device-less compile the memory a real GPU uses? For a few zoo models (`memory_zoo.py`), three numbers
per device on a machine with one NVIDIA GPU:

  (a) the training step compiled without the GPU, for its kfast name (`compiled_step_memory(..., device="H100")`,
      in a process with `JAX_PLATFORMS=cpu`, as kfast plans on a machine without one);
  (b) the same step compiled on the GPU itself (`compiled_step_memory(model, batch)`: XLA's buffer assignment
      after autotuning);
  (c) the measured peak: 3 training steps of `model.fit` on random data, then the allocator's
      `jax.devices()[0].memory_stats()["peak_bytes_in_use"]` (a fresh process per model resets it).

Beside them, kfast's analytical estimate for that GPU, and the runtime's margin: `bytes_limit` (the pool JAX
preallocates, 75% of the GPU unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise) against the GPU's total, and
the CUDA context and libraries, read as what `nvidia-smi` says the process uses minus that pool.

On the GPU machine (JAX with CUDA, Keras on JAX, kfast from a wheel; this file and memory_zoo.py side by side):

    pip install 'jax[cuda12]' keras dist/kfast-*.whl      # keras-hub for the GPT-2 case: see memory_zoo.py
    KERAS_BACKEND=jax python benchmarks/gpu_memory_check.py   # under 8 minutes on an H100; JSON to $OUT if set

Here, without a GPU, `--dry-run` checks the script: (a) for an H100 only, (b) and (c) skipped (under 3 minutes on
2 cores):

    KERAS_BACKEND=jax .venv-jax/bin/python benchmarks/gpu_memory_check.py --dry-run

Each model runs in two processes of this script (`--one NAME --part deviceless|device`), each with a timeout: the
device-less compiles (CPU work) all start at once, the GPU runs go one after another (each preallocates the GPU's
pool, and a fresh process resets the allocator's peak); past `BUDGET_S` no GPU run starts. The parent process never
starts JAX, so it holds no GPU memory.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
# Fast zoo members: (name, batch). GPT-2 is left out where keras_hub is not importable.
CHECKS = (("mobilenet_v2", 32), ("resnet50", 32), ("gpt2_lm", 8), ("bilstm", 128))
BUDGET_S = 450.0  # the whole run; 8 minutes on an H100 with the interpreter's start and the table
PART_TIMEOUT_S = {"deviceless": 150.0, "device": 200.0}
DRY_RUN_GPU = "H100"
STEPS = 3
MARK = "RESULT "


def gpu_name(device_kind: str) -> tuple[str | None, str]:
    """kfast's name for a GPU that JAX calls `device_kind`, and how it was matched ("exact", "approximate: ...",
    or "unknown: ...")."""
    from kfast.planning import gpus

    def key(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower())

    for name, spec in gpus.GPUS.items():
        if key(spec.description) == key(device_kind):
            return name, "exact"
    # "NVIDIA H100 NVL" -> H100: the longest kfast name inside JAX's (H100-PCIe before H100).
    inside = sorted((n for n in gpus.GPUS if key(n) in key(device_kind)), key=len, reverse=True)
    if inside:
        return inside[0], f"approximate: {device_kind!r} is not {gpus.GPUS[inside[0]].description!r}"
    return None, f"unknown: kfast has no GPU like {device_kind!r} (known: {', '.join(gpus.GPUS)})"


def _zoo() -> Any:
    sys.path.insert(0, HERE)
    import memory_zoo

    return memory_zoo


def deviceless_part(name: str, n: int, device_kind: str | None) -> dict[str, Any]:
    """(a) and kfast's analytical estimate, in a process started with JAX_PLATFORMS=cpu."""
    from kfast.planning import compiled_step_memory
    from kfast.planning import estimate_memory

    zoo = _zoo()
    if device_kind is None:
        gpu, match = DRY_RUN_GPU, "dry run: compiled for an H100"
    elif not device_kind:
        gpu, match = None, "unknown: JAX found no GPU here (run with --dry-run on a machine without one)"
    else:
        gpu, match = gpu_name(device_kind)
    out: dict[str, Any] = {"gpu": gpu, "match": match}
    if gpu is None:
        return out
    model = zoo.build(zoo.CASES[name])
    batch = zoo.CASES[name].batch(n)
    start = time.perf_counter()
    out["deviceless"] = compiled_step_memory(model, batch, device=gpu).to_dict()
    out["deviceless_s"] = round(time.perf_counter() - start, 1)
    out["analytical"] = int(estimate_memory(model, batch, device=gpu, method="analytical").peak)
    return out


def _nvidia_smi(pid: int) -> dict[str, int]:
    """The GPU's total memory and what process `pid` uses on it (bytes), from nvidia-smi; empty without it."""
    if shutil.which("nvidia-smi") is None:
        return {}
    out: dict[str, int] = {}
    try:
        total = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20).stdout.split()
        if total:
            out["total"] = int(float(total[0])) * 2**20
        apps = subprocess.run(["nvidia-smi", "-i", "0", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        for line in apps.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
                out["process_used"] = int(fields[1]) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return out


def device_part(name: str, n: int) -> dict[str, Any]:
    """(c) the measured peak of `STEPS` steps of fit, then (b) the step compiled on the GPU itself."""
    import jax
    import keras

    from kfast.planning import compiled_step_memory

    device = jax.devices()[0]
    if device.platform != "gpu":
        return {"error": f"no GPU: JAX's first device is {device.platform!r}; run with --dry-run here"}
    zoo = _zoo()
    case = zoo.CASES[name]
    model = zoo.build(case)
    x, y = case.batch(STEPS * n)
    out: dict[str, Any] = {"device_kind": device.device_kind, "before_fit": device.memory_stats().get("bytes_in_use")}
    start = time.perf_counter()
    keras.config.set_dtype_policy(case.policy)
    try:
        model.fit(x, y, batch_size=n, epochs=1, shuffle=False, verbose=0)
    finally:
        keras.config.set_dtype_policy("float32")
    out["fit_s"] = round(time.perf_counter() - start, 1)
    stats = device.memory_stats()
    out["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    out["bytes_limit"] = stats.get("bytes_limit")
    out["memory_stats"] = stats
    out["nvidia_smi"] = _nvidia_smi(os.getpid())
    start = time.perf_counter()
    out["on_device"] = compiled_step_memory(model, case.batch(n)).to_dict()
    out["on_device_s"] = round(time.perf_counter() - start, 1)
    return out


def one(name: str, n: int, part: str, dry_run: bool) -> None:
    """A child process: one part for one model, its result as the last line of stdout."""
    try:
        if part == "deviceless":
            kind = None if dry_run else os.environ.get("KFAST_CHECK_DEVICE_KIND")
            result = deviceless_part(name, n, kind)
        else:
            result = device_part(name, n)
    except Exception as e:  # noqa: BLE001 - reported in the parent's table with the child's reason
        message = str(e).strip().splitlines()
        result = {"error": f"{type(e).__name__}: {message[0] if message else ''}"[:400]}
    print(MARK + json.dumps(result), flush=True)


def _start(name: str, n: int, part: str, dry_run: bool, env: dict[str, str]) -> subprocess.Popen:
    args = [sys.executable, os.path.abspath(__file__), "--one", name, "--batch", str(n), "--part", part]
    return subprocess.Popen(args + (["--dry-run"] if dry_run else []), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float, part: str) -> dict[str, Any]:
    try:
        stdout, _ = proc.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"the {part} process ran past {timeout:.0f} s and was stopped"}
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        tail = [line for line in stdout.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        return {"error": f"the {part} process ended with status {proc.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1][len(MARK):])


def _device_kind(env: dict[str, str]) -> str:
    """JAX's `device_kind` of GPU 0, read in a short process without preallocation (the parent does not start JAX:
    it would hold the GPU's memory while the children measure it); "" when there is none."""
    probe = "import jax; d = jax.devices()[0]; print(d.device_kind if d.platform == 'gpu' else '')"
    try:
        done = subprocess.run([sys.executable, "-c", probe], env={**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ""
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if lines else ""


def _has_keras_hub() -> bool:
    import importlib.util

    return importlib.util.find_spec("keras_hub") is not None


def gb(n: int | None) -> str:
    return "" if n is None else f"{n / 1e9:.3f} GB"


def _ratio(a: int | None, b: int | None) -> str:
    return "" if not a or not b else f"{a / b:.2f}"


def main_run(dry_run: bool) -> list[dict[str, Any]]:
    deadline = time.monotonic() + BUDGET_S
    base = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    base["KERAS_BACKEND"] = "jax"
    kind = "" if dry_run else _device_kind(base)
    if not dry_run and not kind:
        raise SystemExit("gpu_memory_check found no GPU: JAX's first device is not one (is jax[cuda12] installed?). "
                         "On a machine without a GPU, run it with --dry-run.")
    print(f"GPU 0: {kind or 'none (dry run: compiling for an H100)'}", file=sys.stderr, flush=True)
    deviceless_env = {**base, "JAX_PLATFORMS": "cpu", "KFAST_CHECK_DEVICE_KIND": kind}
    rows: list[dict[str, Any]] = []
    for name, n in CHECKS:
        rows.append({"model": name, "batch": n})
        if name.startswith("gpt2") and not _has_keras_hub():
            rows[-1]["skipped"] = "keras_hub is not importable"
    todo = [row for row in rows if "skipped" not in row]
    # With a GPU the device-less compiles (CPU work) all start now, beside the GPU runs, which go one at a time:
    # each preallocates the GPU's pool. On 2 cores without a GPU the compiles go one at a time.
    compiles = {} if dry_run else {row["model"]: _start(row["model"], row["batch"], "deviceless", False,
                                                        deviceless_env) for row in todo}
    for row in todo:
        name, n = row["model"], row["batch"]
        start = time.monotonic()
        if dry_run:
            proc = _start(name, n, "deviceless", True, deviceless_env)
            row["deviceless"] = _finish(proc, min(PART_TIMEOUT_S["deviceless"], deadline - time.monotonic()),
                                        "deviceless")
            row["device"] = {"skipped": "--dry-run: no GPU here, so neither the on-device compile nor fit"}
        elif deadline - time.monotonic() < 30:
            row["device"] = {"error": f"not run: past the {BUDGET_S:.0f} s budget"}
        else:
            proc = _start(name, n, "device", False, base)
            row["device"] = _finish(proc, min(PART_TIMEOUT_S["device"], deadline - time.monotonic()), "device")
        row["seconds"] = round(time.monotonic() - start, 1)
        print(f"{name} batch {n}: {row['seconds']:.0f} s", file=sys.stderr, flush=True)
    for row in todo:
        if row["model"] in compiles:
            row["deviceless"] = _finish(compiles[row["model"]],
                                        min(PART_TIMEOUT_S["deviceless"], deadline - time.monotonic() + 30),
                                        "deviceless")
    return rows


def report(rows: list[dict[str, Any]], dry_run: bool) -> None:
    print("| model | batch | GPU (kfast name) | (a) device-less | (b) on the GPU | (c) measured peak | (a)/(c) "
          "| (b)/(c) | kfast analytical | analytical/(c) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "skipped" in row:
            print(f"| {row['model']} | {row['batch']} | skipped: {row['skipped']} | | | | | | | |")
            continue
        a, d = row.get("deviceless", {}), row.get("device", {})
        a_total = a.get("deviceless", {}).get("total")
        b_total = d.get("on_device", {}).get("total")
        peak = d.get("peak_bytes_in_use")
        gpu = a.get("gpu") or "unknown"
        a_cell = gb(a_total) or f"not compiled: {a.get('error', a.get('match', ''))}"
        b_cell = gb(b_total) or (d.get("skipped") and "skipped") or f"failed: {d.get('error', '')}"
        c_cell = gb(peak) or ("skipped" if "skipped" in d else "")
        print(f"| {row['model']} | {row['batch']} | {gpu} | {a_cell} | {b_cell} | {c_cell} | "
              f"{_ratio(a_total, peak)} | {_ratio(b_total, peak)} | {gb(a.get('analytical'))} | "
              f"{_ratio(a.get('analytical'), peak)} |")
    print()
    if dry_run:
        print("dry run: (a) and kfast's estimate for an H100, compiled without one; (b) and (c) need the GPU")
        return
    for row in rows:
        d, a = row.get("device", {}), row.get("deviceless", {})
        if a.get("match") and a.get("match") != "exact":
            print(f"{row['model']}: GPU name {a['match']}")
        if "skipped" in d:
            print(f"{row['model']}: (b) and (c) skipped: {d['skipped']}")
        elif "error" in d:
            print(f"{row['model']}: (b)/(c) failed: {d['error']}")
        limit, smi = d.get("bytes_limit"), d.get("nvidia_smi", {})
        if limit:
            total = smi.get("total")
            line = f"{row['model']}: JAX's pool (bytes_limit) {gb(limit)}"
            if total:
                line += f" of the GPU's {gb(total)} ({limit / total:.1%})"
            if smi.get("process_used") and os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() != "false":
                line += (f"; nvidia-smi: the process uses {gb(smi['process_used'])}, so the CUDA context and "
                         f"libraries take about {gb(smi['process_used'] - limit)}")
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: (a) for an H100 only, (b) and (c) skipped")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=("deviceless", "device"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.batch, args.part, args.dry_run)
        return
    start = time.monotonic()
    rows = main_run(args.dry_run)
    report(rows, args.dry_run)
    elapsed = time.monotonic() - start
    print(f"\n{elapsed:.0f} s in all", file=sys.stderr)
    folder = os.environ.get("OUT")
    if folder:
        path = os.path.join(folder, "gpu_memory_check.json")
        with open(path, "w") as f:
            json.dump({"dry_run": args.dry_run, "seconds": round(elapsed, 1), "steps": STEPS, "rows": rows}, f,
                      indent=1)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
