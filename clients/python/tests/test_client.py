"""The blocking client against a real local cluster: connecting, chunks single and in
batches, offsets, durability, locks, nameservice, barriers, temporary storage, cluster
views, errors and timeouts."""

import asyncio
import builtins
import json
import threading
import time

import pytest

import myriad
from conftest import SECRET


def test_connect_by_cluster_dir_and_by_superpeers_with_secret(cluster):
    with cluster.connect() as by_dir, myriad.Client.connect(
        superpeers=cluster.superpeers, secret=SECRET
    ) as by_list:
        assert by_dir.node_id != by_list.node_id
        cid = by_dir.create_with_data(by_dir.peers()[0], [b"shared"])[0]
        assert by_list.get(cid) == b"shared"
        ids = {node["id"] for node in by_list.nodes() if node["role"] == "client"}
        assert {by_dir.node_id, by_list.node_id} <= ids


def test_the_given_secret_is_in_a_0600_file_and_on_no_command_line(cluster):
    assert cluster.secret == SECRET
    assert cluster.secret_file == cluster.dir.resolve() / "secret"
    assert cluster.secret_file.stat().st_mode & 0o777 == 0o600
    assert cluster.secret_file.read_text() == SECRET + "\n"
    described = json.loads((cluster.dir / "cluster.json").read_text())
    assert described["secret_file"] == str(cluster.secret_file)
    assert SECRET not in (cluster.dir / "cluster.json").read_text()
    for node in cluster.nodes():
        with open(f"/proc/{node['pid']}/cmdline", "rb") as cmdline:
            args = cmdline.read().split(b"\0")
        assert SECRET.encode() not in b" ".join(args)
        assert args[args.index(b"--secret-file") + 1] == str(cluster.secret_file).encode()


def test_connect_with_a_secret_file_or_the_environments_file(cluster, monkeypatch):
    monkeypatch.delenv("MYRIAD_SECRET_FILE", raising=False)
    with myriad.Client.connect(
        superpeers=cluster.superpeers, secret_file=cluster.secret_file
    ) as by_file:
        assert set(by_file.peers()) == set(cluster.peer_ids)
    monkeypatch.setenv("MYRIAD_SECRET_FILE", str(cluster.secret_file))
    with myriad.Client.connect(superpeers=cluster.superpeers) as by_env:
        assert set(by_env.peers()) == set(cluster.peer_ids)


def test_without_any_secret_connect_refuses_before_joining(cluster, monkeypatch):
    monkeypatch.delenv("MYRIAD_SECRET_FILE", raising=False)
    with pytest.raises(ValueError, match="no cluster secret"):
        myriad.Client.connect(superpeers=cluster.superpeers)
    with pytest.raises(ValueError, match="at most one"):
        myriad.Client.connect(
            superpeers=cluster.superpeers, secret=SECRET, secret_file=cluster.secret_file
        )
    with pytest.raises(ValueError):
        myriad.Client.connect(superpeers=cluster.superpeers, secret="")


def test_a_secret_file_others_may_read_is_refused(cluster, tmp_path):
    loose = tmp_path / "loose"
    loose.write_text(SECRET + "\n")
    loose.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600") as caught:
        myriad.Client.connect(superpeers=cluster.superpeers, secret_file=loose)
    assert SECRET not in str(caught.value)
    with pytest.raises(ValueError):
        myriad.Client.connect(superpeers=cluster.superpeers, secret_file=tmp_path / "missing")


def test_the_former_default_secret_is_refused(cluster):
    with pytest.raises(myriad.MyriadError):
        myriad.Client.connect(superpeers=cluster.superpeers, secret="myriad", connect_timeout=1.0)


def test_connect_with_a_wrong_secret_fails_within_its_timeout(cluster):
    started = time.monotonic()
    with pytest.raises(myriad.MyriadError):
        myriad.Client.connect(superpeers=cluster.superpeers, secret="wrong", connect_timeout=1.0)
    assert time.monotonic() - started < 10


def test_connect_needs_exactly_one_way_to_find_the_cluster(cluster):
    with pytest.raises(ValueError):
        myriad.Client.connect()
    with pytest.raises(ValueError):
        myriad.Client.connect(cluster_dir=str(cluster.dir), superpeers=cluster.superpeers)
    with pytest.raises(ValueError):
        myriad.Client.connect(superpeers=["no-at-sign"])


def test_lane_spin_is_bounded_and_reads_alike_spinning_or_not(cluster, client, peer):
    values = [bytes([i]) * 8 for i in range(16)]
    cids = client.create_with_data(peer, values)
    for round, spin in enumerate((0.0, 0.001)):
        with cluster.connect(lane_spin=spin) as spinning:
            assert spinning.get_batch(cids[1:]) == values[1:]
            value = f"spin {round:3d}".encode()
            spinning.put(cids[0], value)
            assert spinning.get(cids[0]) == value
    for bad in (-1e-6, 0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lane_spin"):
            cluster.connect(lane_spin=bad)


def test_single_create_get_put_size_remove(client, peer):
    cid = client.create(peer, 16)
    assert cid >> 48 == peer
    assert client.get(cid) == bytes(16)
    client.put(cid, b"0123456789abcdef")
    assert client.get(cid) == b"0123456789abcdef"
    assert client.size(cid) == 16
    client.remove(cid)
    with pytest.raises(myriad.NotFoundError) as caught:
        client.get(cid)
    assert caught.value.cid == cid
    assert caught.value.kind == "not_found"
    assert isinstance(caught.value, KeyError)


def test_put_of_the_wrong_size_is_an_invalid_argument(client, peer):
    cid = client.create(peer, 4)
    with pytest.raises(myriad.InvalidArgumentError) as caught:
        client.put(cid, b"too long")
    assert isinstance(caught.value, ValueError)


def test_batches_keep_order_and_name_the_failed_item(client, peer):
    sizes = [1, 2, 3, 4, 5]
    cids = client.create_batch(peer, sizes)
    assert [client.size(cid) for cid in cids] == sizes
    payloads = [bytes([i]) * size for i, size in enumerate(sizes)]
    client.put_batch(list(zip(cids, payloads)))
    assert client.get_batch(cids) == payloads
    more = client.create_with_data(peer, [b"a", b"bb", b"ccc"])
    assert client.get_batch(more) == [b"a", b"bb", b"ccc"]
    client.remove_batch(more[1:2])
    with pytest.raises(myriad.NotFoundError) as caught:
        client.get_batch(more)
    assert caught.value.index == 1
    assert caught.value.cid == more[1]


def test_chunks_on_every_peer_are_routed_to_their_owner(client):
    peers = client.peers()
    assert len(peers) == 3
    cids = [client.create_with_data(peer, [f"on {peer}".encode()])[0] for peer in peers]
    assert [cid >> 48 for cid in cids] == peers
    assert client.get_batch(cids) == [f"on {peer}".encode() for peer in peers]


def test_offset_read_write_and_resize(client, peer):
    cid = client.create_with_data(peer, [b"abcdefgh"])[0]
    client.write_at(cid, 2, b"XY")
    assert client.read_at(cid, 1, 4) == b"bXYe"
    client.resize(cid, 10)
    assert client.get(cid) == b"abXYefgh\x00\x00"
    client.resize(cid, 3)
    assert client.get(cid) == b"abX"


@pytest.mark.parametrize("durability", ["default", "async", "replicated", "durable", 0, 3])
def test_durability_per_call(client, peer, durability):
    cid = client.create(peer, 4, durability=durability)
    client.put(cid, b"dura", durability=durability)
    client.put_batch([(cid, b"bili")], durability=durability)
    assert client.get(cid) == b"bili"


def test_unknown_durability_is_refused_before_sending(client, peer):
    with pytest.raises(ValueError):
        client.create(peer, 4, durability="eventually")
    with pytest.raises(TypeError):
        client.create(peer, 4, durability=9)


def test_lock_context_manager_excludes_another_client(cluster, client, peer):
    cid = client.create_with_data(peer, [b"lock"])[0]
    with cluster.connect() as other:
        with client.lock(cid, wait=1.0) as locked:
            assert locked == cid
            with pytest.raises(myriad.LockTimeoutError) as caught:
                other.lock_acquire(cid, wait=0.2)
            assert caught.value.cid == cid
            assert isinstance(caught.value, builtins.TimeoutError)
        # Released on exit: the other client gets it now.
        with other.lock(cid, wait=1.0):
            pass


def test_nameservice(client, peer):
    cid = client.create(peer, 8)
    client.name_register("pytest-name", cid)
    assert client.name_get("pytest-name") == cid
    assert client.name_list()["pytest-name"] == cid
    client.name_remove("pytest-name")
    assert client.name_get("pytest-name") is None


def test_barrier_releases_both_participants(cluster, client):
    barrier = client.barrier_alloc(2)
    results = {}

    def sign_on(name, connected, value):
        results[name] = connected.barrier_sign_on(barrier, value, timeout=10.0)

    with cluster.connect() as other:
        threads = [
            threading.Thread(target=sign_on, args=("a", client, 11)),
            threading.Thread(target=sign_on, args=("b", other, 22)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
        expected = sorted([(client.node_id, 11), (other.node_id, 22)])
        assert sorted(results["a"]) == expected
        assert sorted(results["b"]) == expected
    status = client.barrier_status(barrier)
    assert status["size"] == 2 and status["round"] == 1
    client.barrier_resize(barrier, 3)
    assert client.barrier_status(barrier)["size"] == 3
    client.barrier_free(barrier)
    assert client.barrier_status(barrier) is None


def test_barrier_sign_on_times_out_when_alone(client):
    barrier = client.barrier_alloc(2)
    started = time.monotonic()
    with pytest.raises(myriad.TimeoutError) as caught:
        client.barrier_sign_on(barrier, 1, timeout=0.3)
    elapsed = time.monotonic() - started
    assert isinstance(caught.value, builtins.TimeoutError)
    assert 0.25 <= elapsed < 3.0
    client.barrier_free(barrier)


def test_temporary_storage(client):
    client.tmp_create("pytest-tmp", b"first")
    assert client.tmp_get("pytest-tmp") == b"first"
    with pytest.raises(myriad.MetaError):
        client.tmp_create("pytest-tmp", b"again")
    client.tmp_put("pytest-tmp", b"second")
    assert client.tmp_get("pytest-tmp") == b"second"
    assert client.tmp_list()["pytest-tmp"] == len(b"second")
    client.tmp_remove("pytest-tmp")
    assert client.tmp_get("pytest-tmp") is None


def test_node_list_cluster_status_and_recovery_status(cluster, client):
    nodes = client.nodes()
    roles = sorted(node["role"] for node in nodes if node["state"] == "alive")
    assert roles.count("superpeer") == 1
    assert roles.count("peer") == 3
    assert sorted(client.peers()) == sorted(cluster.peer_ids)
    status = client.status()
    assert status["leader"] == 1
    assert status["members"][0][0] == 1
    recovery = client.recovery_status()
    assert recovery["leader"] is True
    assert isinstance(recovery["zones"], list)


def test_the_gil_is_released_while_a_call_waits(client):
    """A thread waits 1.5 s inside a call; the main thread must run Python meanwhile."""
    barrier = client.barrier_alloc(2)
    inside = threading.Event()
    done = threading.Event()

    def wait_alone():
        inside.set()
        try:
            client.barrier_sign_on(barrier, 0, timeout=1.5)
        except myriad.TimeoutError:
            pass
        done.set()

    thread = threading.Thread(target=wait_alone)
    thread.start()
    inside.wait(5)
    began = time.monotonic()
    time.sleep(0.2)  # lets the thread get into the call
    spins = 0
    while time.monotonic() < began + 0.7:
        spins += 1
    still_waiting = not done.is_set()
    thread.join(5)
    # With the GIL held during the wait, the main thread would not run again before
    # the call ended (about 1.5 s): no spins in the window, and the call already over.
    assert still_waiting
    assert spins > 10_000, spins
    client.barrier_free(barrier)


def test_threads_share_one_client(client, peer):
    cids = client.create_with_data(peer, [bytes([i]) * 8 for i in range(64)])
    errors = []

    def worker(offset):
        try:
            for round_ in range(50):
                index = (offset + round_) % 64
                assert client.get(cids[index]) == bytes([index]) * 8
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []


def test_calls_after_close_raise_shutdown(cluster):
    connected = cluster.connect()
    peer = connected.peers()[0]
    cid = connected.create(peer, 8)
    connected.close()
    calls = [
        lambda: connected.create(peer, 8),
        lambda: connected.get(cid),
        lambda: connected.get_array([cid], 8),
        lambda: connected.name_get("x"),
    ]
    for call in calls:
        with pytest.raises(myriad.ShutdownError):
            call()

    async def later():
        with pytest.raises(myriad.ShutdownError):
            await connected.aio.get(cid)

    asyncio.run(later())


def test_close_waits_for_calls_in_flight(cluster):
    connected = cluster.connect()
    barrier = connected.barrier_alloc(2)
    outcome = []

    def wait_alone():
        try:
            connected.barrier_sign_on(barrier, 0, timeout=0.5)
        except myriad.MyriadError as error:
            outcome.append(error.kind)

    thread = threading.Thread(target=wait_alone)
    thread.start()
    time.sleep(0.1)
    connected.close()
    thread.join(5)
    # The call ran to its own end (its timeout), not into a runtime that was gone.
    assert outcome == ["timeout"]


def test_invalid_timeout_is_refused(client, peer):
    with pytest.raises(ValueError):
        client.create(peer, 8, timeout=0)
    with pytest.raises(ValueError):
        client.create(peer, 8, timeout=float("nan"))
