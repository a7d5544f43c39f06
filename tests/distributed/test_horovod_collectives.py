"""The router's collectives on the Horovod engine, two ranks under horovodrun (the JAX engine's are in
test_jax_engine.py)."""

import json

from helpers import rank_lines


def test_the_router_carries_horovods_collectives_and_the_preemption_vote(horovodrun):
    out = horovodrun("tests/distributed/horovod_collectives.py", timeout=180)
    reports = {r: json.loads(line.split("REPORT ", 1)[1]) for r, line in rank_lines(out, "REPORT ").items()}
    assert sorted(reports) == [0, 1], out
    for rank, r in reports.items():
        assert (r["rank"], r["size"], r["initialized"]) == (rank, 2, True)
        assert r["broadcast"] == ["from", 1, repr(b"x" * 11)]  # rank 1's, as the root
        assert r["maximum"] == [5, 7, 0]
        assert r["bad_root"] == "broadcast_object got root_rank=2; this job's ranks are 0 to 1."
        assert r["votes"] == [None, ["SIGTERM on another rank", "SIGTERM"][rank]]
