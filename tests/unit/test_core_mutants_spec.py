"""Cluster and job specs: looking a host up by name, ``--env`` parsing, local hosts, and what a
spec file's host keeps when ``--hosts`` names it.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2).
"""

import pytest

from poprun_py.core.hosts import HostEntry
from poprun_py.core.spec import ClusterSpec, HostSpec, cluster_from_hosts


def test_an_unknown_host_is_a_key_error_naming_it() -> None:
    cluster = ClusterSpec("c", (HostSpec("a"), HostSpec("b")))
    assert cluster.host("b") is cluster.hosts[1]
    with pytest.raises(KeyError) as caught:
        cluster.host("z")
    assert caught.value.args == ("z",)


def test_hosts_named_in_a_spec_keep_what_it_says_of_them() -> None:
    base = ClusterSpec(
        "c", (HostSpec("a", address="10.0.0.1", user="u", port=2222, slots=2),), env={"X": "1"}
    )
    cluster = cluster_from_hosts([HostEntry("a"), HostEntry("b", 3)], base=base)
    assert cluster.hosts == (
        HostSpec("a", address="10.0.0.1", user="u", port=2222, slots=2),
        HostSpec("b", slots=3),
    )
    assert (cluster.name, dict(cluster.env)) == ("c", {"X": "1"})
