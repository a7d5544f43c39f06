"""Fixtures of the multi-host tests: one harness per test module (see harness.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # harness.py and runner.py

import harness  # noqa: E402 - needs the path above


@pytest.fixture(scope="module")
def cluster():
    """Three hosts, hostA, hostB and hostC, each with its own sshd; torn down after the module."""
    reason = harness.unavailable_reason()
    if reason:
        pytest.skip(reason)
    if not harness.sshd_path():
        pytest.fail("sshd is missing: run `bash scripts/setup_multihost.sh` as root (make test does).")
    c = harness.Cluster().start()
    print(f"\nmulti-host harness up in {c.setup_s:.2f} s: {c.address}")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def fresh(cluster):
    """The cluster, with every host brought back (link up, sshd running, nothing else left) afterwards."""
    yield cluster
    for name in cluster.names:
        cluster.reset(name)
