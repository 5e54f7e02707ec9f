"""The compute platform from Python against a real cluster of its own: peers configured
as slaves of group 1, one made master at run time; a registered job run on a named peer,
a task script with a condition run on the group (finished, then aborted by the
condition), and the errors of bad input."""

import time

import pytest

import myriad
import myriad.errors

CONFIG = '[compute]\ngroup = 1\nrole = "slave"\n'

SCRIPT = """
name = "python-values"
slaves_min = 2
task_timeout_ms = 20000

[[task]]
name = "builtin.value"
params = { values = [1, 2] }

[[task]]
name = "builtin.value"
params = { value = 7 }
when = { value = "sum", op = "==", than = 3 }
"""


@pytest.fixture(scope="module")
def group_cluster(tmp_path_factory):
    config = tmp_path_factory.mktemp("compute") / "compute.toml"
    config.write_text(CONFIG)
    with myriad.local_cluster(peers=3, peer_memory_mb=64, config=str(config)) as cluster:
        yield cluster


def wait_for_slaves(client, group, count, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            master, slaves = client.compute_group(group)
            if len(slaves) == count:
                return master, slaves
        except myriad.errors.MyriadError:
            pass
        assert time.monotonic() < deadline, f"group {group} never had {count} slaves"
        time.sleep(0.1)


def test_jobs_and_task_scripts_run_on_the_peers(group_cluster):
    with group_cluster.connect(timeout=10.0) as client:
        peers = sorted(client.peers())
        # A registered job, on each named peer: builtin.whoami answers the peer's node ID
        # (two bytes, little-endian).
        for peer in peers:
            answer = client.run_job(peer, "builtin.whoami")
            assert int.from_bytes(answer, "little") == peer

        client.compute_set_role(peers[0], 1, "master")
        master, slaves = wait_for_slaves(client, 1, 2)
        assert master == peers[0]
        assert sorted(slaves) == peers[1:]

        outcome = client.run_task_script(1, SCRIPT, timeout=30.0)
        assert outcome["end"] == "finished", outcome
        assert outcome["reason"] is None
        assert [task["task"] for task in outcome["tasks"]] == ["builtin.value"] * 2
        first = [int.from_bytes(v, "little") for v in outcome["tasks"][0]["values"]]
        assert first == [1, 2]
        second = [int.from_bytes(v, "little") for v in outcome["tasks"][1]["values"]]
        assert second == [7, 7]
        assert sorted(outcome["tasks"][0]["slaves"]) == peers[1:]

        # The condition fails (1 + 2 != 4): the script stops after its first task.
        aborted = client.run_task_script(1, SCRIPT.replace("than = 3", "than = 4"))
        assert aborted["end"] == "aborted", aborted
        assert "sum == 4" in aborted["reason"]
        assert len(aborted["tasks"]) == 1


def test_compute_errors_are_typed(group_cluster):
    with group_cluster.connect(timeout=5.0) as client:
        peer = client.peers()[0]
        with pytest.raises(myriad.errors.InvalidArgumentError):
            client.run_job(peer, "no.such.job")
        with pytest.raises(myriad.errors.InvalidArgumentError):
            client.run_task_script(1, "this is not a script [[[")
        with pytest.raises(myriad.errors.InvalidArgumentError):
            client.run_task_script(9, SCRIPT)
        with pytest.raises(myriad.errors.InvalidArgumentError):
            client.compute_set_role(peer, 1, "captain")
