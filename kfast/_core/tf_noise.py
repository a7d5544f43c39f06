"""TensorFlow's start-up lines, told apart from real output and dropped from what `kfast launch` shows.

Every process that imports TensorFlow writes a few lines to stderr before TensorFlow reads any setting
(so `TF_CPP_MIN_LOG_LEVEL` cannot hide them), twice when the library loads twice, and horovodrun repeats
them for every rank:

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1795988394.179937   24508 port.cc:153] oneDNN custom operations are on. You may see ...
    I0000 00:00:1795988394.277964   24508 cpu_feature_guard.cc:227] This TensorFlow binary is optimized ...
    To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with ...

and, where NVIDIA's CUDA wheels are installed (kfast[plan-gpu] brings the nvcc one) on a machine without a driver:

    I0000 00:00:1796676025.557661   30219 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU ...

(`kfast doctor` says whether a GPU is seen, and why not.) Only those lines match (with or without horovodrun's `[rank]<stderr>:` prefix); warnings and errors,
TensorFlow's included, pass. `KFAST_TF_STARTUP_LOGS=1` passes everything.

The module imports nothing from kfast, so a shell can filter through it without starting TensorFlow:
`kfast doctor 2> >(python kfast/_core/tf_noise.py >&2)` (`make demo` does).
"""

import os
import re
import sys

SHOW_VARIABLE = "KFAST_TF_STARTUP_LOGS"

_PREFIX = r"(?:\[\d+\]<std(?:out|err)>:)?(?:[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ [\d:]+ \d{4}\[\d+\]<std(?:out|err)>:)?"
_ABSL_INFO = r"I\d{4} [\d:.]+ +\d+ "
_NOISE = re.compile(_PREFIX + "(?:" + "|".join([
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    _ABSL_INFO + r"port\.cc:\d+\] oneDNN custom operations are on\. .*",
    _ABSL_INFO + r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU "
                 r"instructions in performance-critical operations\.",
    r"To enable the following instructions: [A-Z0-9_ ]+, in other operations, rebuild TensorFlow with the "
    r"appropriate compiler flags\.",
    _ABSL_INFO + r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\.",
]) + r")\r?\n?")


def is_noise(line):
    """True for one of TensorFlow's start-up lines (str or bytes, with or without the newline)."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    return _NOISE.fullmatch(line) is not None


def enabled():
    """False when `KFAST_TF_STARTUP_LOGS=1` asks for TensorFlow's start-up lines."""
    return os.environ.get(SHOW_VARIABLE, "") not in ("1", "true", "yes")


def copy(source, target, watch=None):
    """Copies lines from binary file `source` to binary file `target` until end of file, dropping the
    start-up lines (all of them pass when filtering is off) and flushing after each line. `watch`, if
    given, sees every line first."""
    drop = enabled()
    reader_gone = False
    for line in iter(source.readline, b""):
        if watch is not None:
            watch(line)
        if reader_gone or (drop and is_noise(line)):
            continue  # keep draining, so the writer never blocks on a full pipe
        try:
            target.write(line)
            target.flush()
        except (BrokenPipeError, ValueError):
            reader_gone = True


if __name__ == "__main__":
    copy(sys.stdin.buffer, sys.stdout.buffer)
