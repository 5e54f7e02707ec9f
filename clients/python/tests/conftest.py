"""Fixtures: one real local cluster (1 superpeer, 3 peers, processes of the `myriad`
binary) for the whole test session, and a connected client per test.

The binary is `MYRIAD_BIN` (scripts/test-python sets it to the one the same run built),
else what `myriad.find_binary()` finds. Every node is stopped at the end of the session
(and exits by itself if pytest dies: the launcher starts them with --exit-with-parent).
"""

import pytest

import myriad

SECRET = "pytest-secret"


@pytest.fixture(scope="session")
def cluster():
    with myriad.local_cluster(peers=3, superpeers=1, peer_memory_mb=128, secret=SECRET) as running:
        yield running


@pytest.fixture
def client(cluster):
    with cluster.connect(timeout=5.0) as connected:
        yield connected


@pytest.fixture
def peer(client):
    return client.peers()[0]
