"""kfast.cluster.hosts: the one reader of `-H host:slots,...` lists, and the callers that share it."""

import re

import pytest

from kfast.cli.launch import launch_command
from kfast.cluster import jax_hosts
from kfast.cluster.hosts import parse_host_list
from kfast.env import preflight


@pytest.mark.parametrize("hosts, expected", [
    ("host1:4", (("host1", 4),)),
    ("host1:4,host2:2", (("host1", 4), ("host2", 2))),
    ("gpu-01.cluster.local:8,10.0.0.7:1,node_3:0", (("gpu-01.cluster.local", 8), ("10.0.0.7", 1), ("node_3", 0))),
    ("a:1,a:2", (("a", 1), ("a", 2))),  # as given: horovodrun reads it so
])
def test_a_host_list_gives_its_hosts_and_slots_in_order(hosts, expected):
    found = parse_host_list(hosts)
    assert found.hosts == expected
    assert found.np == sum(n for _, n in expected) and found.host_list == hosts
    assert found.source == f"-H {hosts}"


@pytest.mark.parametrize("hosts, message", [
    ("", "-H '' names no host; expected host:slots[,host:slots...], e.g. -H host1:4,host2:4 (leave -H out to run "
         "on this machine)."),
    ("  ", "-H '  ' names no host"),
    ("host1", "-H 'host1' is not a host list; expected host:slots[,host:slots...], e.g. -H host1:4,host2:4."),
    ("a:1,b", "-H 'a:1,b' is not a host list"),
    ("a:1,", "-H 'a:1,' is not a host list"),
    ("a:1, b:1", "-H 'a:1, b:1' is not a host list"),
    ("a:x", "-H 'a:x' is not a host list"),
    ("a:-1", "-H 'a:-1' is not a host list"),
    ("a:1:2", "-H 'a:1:2' is not a host list"),
    ("a b:1", "-H 'a b:1' is not a host list"),
])
def test_a_malformed_host_list_says_what_was_expected(hosts, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_host_list(hosts)


def test_too_few_slots_for_np_is_an_error_and_enough_is_not():
    assert parse_host_list("a:2,b:2", np=4).np == 4
    with pytest.raises(ValueError, match=r"^-H a:2,b:1 offers 3 slot\(s\) for -np 4; add hosts or slots\.$"):
        parse_host_list("a:2,b:1", np=4)


def test_slots_may_be_optional_and_the_errors_name_the_option():
    assert parse_host_list("a,b:3", option="--hosts", slots_optional=True).hosts == (("a", 1), ("b", 3))
    with pytest.raises(ValueError, match=r"^--hosts 'a,,b' is not a host list; expected host\[:slots\]"):
        parse_host_list("a,,b", option="--hosts", slots_optional=True)


def test_every_caller_reads_host_lists_alike():
    # launch (Horovod), the JAX starter's layout and the preflight's names: one reader, one set of errors.
    for call in (lambda h: launch_command(2, h, None, "tabular", []), lambda h: jax_hosts.groups(2, h)):
        for hosts, message in [("a:1,b", "is not a host list"), ("", "names no host"), ("a:1", "offers 1 slot")]:
            with pytest.raises(ValueError, match=message):
                call(hosts)
    assert [(g.host, g.count, g.first_id) for g in jax_hosts.groups(3, "a:2,b:2")] == [("a", 2, 0), ("b", 1, 2)]
    assert preflight.host_names("a:2,b:2,a:1") == ["a", "b"]
    with pytest.raises(ValueError, match="is not a host list"):
        preflight.host_names("a:2,,b")
