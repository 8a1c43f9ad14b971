"""Cluster and job specs: looking a host up by name, ``--env`` parsing, local hosts, and what a
spec file's host keeps when ``--hosts`` names it.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2).
"""

from dataclasses import replace

import pytest

from poprun_py.core.hosts import HostEntry
from poprun_py.core.spec import ClusterSpec, HostSpec, cluster_from_hosts
from poprun_py.core.topology import uniform


def test_an_unknown_host_is_a_key_error_naming_it() -> None:
    cluster = ClusterSpec("c", (HostSpec("a"), HostSpec("b")))
    assert cluster.host("b") is cluster.hosts[1]
    with pytest.raises(KeyError) as caught:
        cluster.host("z")
    assert caught.value.args == ("z",)


def test_hosts_named_in_a_spec_keep_what_it_says_of_them() -> None:
    known = HostSpec("a", "10.0.0.1", "u", 2222, "/k", uniform(2, 2), slots=2)
    base = ClusterSpec("c", (known, HostSpec("b", slots=4)), env={"X": "1"})
    cluster = cluster_from_hosts(
        [HostEntry("a"), HostEntry("b", 3), HostEntry("c")], base=base, topology=uniform(1, 4)
    )
    assert cluster.hosts == (
        known,
        HostSpec("b", topology=uniform(1, 4), slots=3),
        HostSpec("c", topology=uniform(1, 4)),
    )
    assert (cluster.name, dict(cluster.env), cluster.simulated) == ("c", {"X": "1"}, False)


def test_a_cluster_is_simulated_when_the_spec_or_the_command_says_so() -> None:
    plain = ClusterSpec("c", ())
    entries = [HostEntry("a")]
    assert cluster_from_hosts(entries, base=plain, simulated=True).simulated is True
    assert cluster_from_hosts(entries, base=replace(plain, simulated=True)).simulated is True
    assert cluster_from_hosts(entries, base=plain).simulated is False


def test_a_cluster_from_hosts_alone_is_called_adhoc() -> None:
    cluster = cluster_from_hosts([HostEntry("a")], simulated=True)
    assert (cluster.name, cluster.simulated, cluster.hosts) == ("adhoc", True, (HostSpec("a"),))
