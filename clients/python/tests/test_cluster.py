"""local_cluster(): real processes started and stopped from Python; a failure drill."""

import os
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
        with cluster.connect() as client:
            cid = client.create_with_data(cluster.peer_ids[0], [b"x"])[0]
            assert client.get(cid) == b"x"
        pids = [node["pid"] for node in nodes]
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(pid) for pid in pids)


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
            zones = client.recovery_status()["zones"]
            assert any(z["owner"] == victim and z["state"] == "done" for z in zones)
            states = {node["id"]: node["state"] for node in client.nodes()}
            assert states[victim] == "failed"


def test_missing_binary_is_reported(tmp_path):
    with pytest.raises(ValueError):
        with myriad.local_cluster(peers=1, dir=tmp_path / "c", binary=tmp_path / "none"):
            pass
