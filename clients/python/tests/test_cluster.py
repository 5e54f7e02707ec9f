"""local_cluster(): real processes started and stopped from Python; a failure drill."""

import os
import re
import shutil
import time

import pytest

import myriad


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): read its state.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_local_cluster_starts_serves_and_stops_every_process(tmp_path):
    with myriad.local_cluster(peers=2, dir=tmp_path / "c", peer_memory_mb=64) as cluster:
        nodes = cluster.nodes()
        assert [node["role"] for node in nodes].count("peer") == 2
        assert all(node["alive"] for node in nodes)
        assert (cluster.dir / "cluster.json").is_file()
        # No secret given: the launcher made a random one in dir/secret, owner-only.
        assert cluster.secret_file == (tmp_path / "c" / "secret").resolve()
        assert cluster.secret_file.stat().st_mode & 0o777 == 0o600
        assert re.fullmatch(r"[0-9a-f]{64}", cluster.secret)
        with cluster.connect() as client:
            cid = client.create_with_data(cluster.peer_ids[0], [b"x"])[0]
            assert client.get(cid) == b"x"
        with myriad.Client.connect(superpeers=cluster.superpeers, secret=cluster.secret) as other:
            assert other.get(cid) == b"x"
        first_secret = cluster.secret
        pids = [node["pid"] for node in nodes]
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(pid) for pid in pids)
    # Started again in the same directory (fresh node data): the same secret.
    shutil.rmtree(tmp_path / "c" / "data")
    with myriad.local_cluster(peers=1, dir=tmp_path / "c", peer_memory_mb=64) as again:
        assert again.secret == first_secret
        with myriad.Client.connect(superpeers=again.superpeers, secret=first_secret) as client:
            assert set(client.peers()) == set(again.peer_ids)


def test_a_given_secret_replaces_the_directorys_and_a_secret_file_is_used_as_it_is(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "secret").write_text("old-secret\n")
    (directory / "secret").chmod(0o644)
    with myriad.local_cluster(peers=1, dir=directory, peer_memory_mb=64, secret="new one") as cluster:
        assert cluster.secret == "new one"
        assert (directory / "secret").stat().st_mode & 0o777 == 0o600
        with cluster.connect() as client:
            assert set(client.peers()) == set(cluster.peer_ids)
    own = tmp_path / "own-secret"
    own.write_text("mine\n")
    own.chmod(0o600)
    with myriad.local_cluster(peers=1, dir=tmp_path / "d", peer_memory_mb=64, secret_file=own) as cluster:
        assert cluster.secret_file == own.resolve()
        assert cluster.secret == "mine"
        assert not (tmp_path / "d" / "secret").exists()
        with myriad.Client.connect(superpeers=cluster.superpeers, secret="mine") as client:
            assert set(client.peers()) == set(cluster.peer_ids)


def test_unusable_secrets_are_refused_before_any_node_starts(tmp_path):
    for bad in ["", "two\nlines", "trailing ", "x" * 1025]:
        with pytest.raises(ValueError):
            with myriad.local_cluster(peers=1, dir=tmp_path / "c", secret=bad):
                pass
    with pytest.raises(ValueError, match="at most one"):
        with myriad.local_cluster(peers=1, dir=tmp_path / "c", secret="a", secret_file=tmp_path / "f"):
            pass
    loose = tmp_path / "loose"
    loose.write_text("s\n")
    loose.chmod(0o640)
    with pytest.raises(RuntimeError, match="chmod 600"):
        with myriad.local_cluster(peers=1, dir=tmp_path / "e", secret_file=loose):
            pass
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_killed_peer_is_recovered_and_its_chunks_read_back(tmp_path):
    with myriad.local_cluster(peers=3, dir=tmp_path / "c", peer_memory_mb=64) as cluster:
        with cluster.connect(timeout=5.0) as client:
            victim = cluster.peer_ids[0]
            cids = client.create_with_data(
                victim, [f"v{i}".encode() for i in range(200)], durability="durable"
            )
            cluster.kill(victim)
            # The call waits for the recovery (bounded by its timeout).
            back = client.get_batch(cids, timeout=30.0)
            assert back == [f"v{i}".encode() for i in range(200)]
            # The restorer commits the victim's ranges before the superpeer records the
            # zone as done: the reads above may win that race, so the status is polled.
            deadline = time.monotonic() + 10.0
            while True:
                zones = client.recovery_status()["zones"]
                if any(z["owner"] == victim and z["state"] == "done" for z in zones):
                    break
                assert time.monotonic() < deadline, f"recovery never reported done: {zones}"
                time.sleep(0.05)
            states = {node["id"]: node["state"] for node in client.nodes()}
            assert states[victim] == "failed"


def test_missing_binary_is_reported(tmp_path):
    with pytest.raises(ValueError):
        with myriad.local_cluster(peers=1, dir=tmp_path / "c", binary=tmp_path / "none"):
            pass
