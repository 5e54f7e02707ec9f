"""TLS with real processes: a cluster started with TLS (``local_cluster(tls=True)``, and
``myriad cluster start --tls`` itself) serves clients holding a certificate of its CA,
found through ``cluster_dir=`` or given as ``tls_dir=``/``tls_name=``; a client without
TLS, a client with a certificate of another CA and a TLS connection without a client
certificate are refused, and the cluster goes on serving the others."""

import os
import socket
import ssl
import subprocess

import pytest

import myriad

REFUSED_JOIN_TIMEOUT = 3.0


def run_myriad(*args, timeout=60):
    """Runs the ``myriad`` binary; returns its completed process (raises on failure)."""
    done = subprocess.run(
        [str(myriad.find_binary()), *[str(arg) for arg in args]],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"myriad {args}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def tls_cluster():
    with myriad.local_cluster(peers=2, superpeers=1, peer_memory_mb=64, tls=True) as running:
        yield running


def put_get(client, peer, data):
    cid = client.create_with_data(peer, [data])[0]
    assert client.get(cid) == data
    return cid


def test_the_cluster_directory_brings_its_certificates(tls_cluster):
    tls = tls_cluster.tls_dir
    assert tls == tls_cluster.dir / "tls"
    for name in ["ca", "superpeer", "peer", "client"]:
        assert (tls / f"{name}.pem").is_file(), name
    assert (tls / "client.key").stat().st_mode & 0o777 == 0o600
    # cluster_dir= finds DIR/tls through cluster.json and uses the client certificate.
    with tls_cluster.connect(timeout=5.0) as client:
        cid = put_get(client, tls_cluster.peer_ids[0], b"over tls")
        # The other peer reads it too (peer to peer over TLS as well).
        assert set(client.peers()) == set(tls_cluster.peer_ids)
        assert client.get(cid) == b"over tls"


def test_a_superpeer_list_with_tls_dir_and_tls_name(tls_cluster):
    tls = tls_cluster.tls_dir
    with myriad.Client.connect(
        superpeers=tls_cluster.superpeers,
        secret_file=tls_cluster.secret_file,
        tls_dir=tls,
    ) as client:
        cid = put_get(client, tls_cluster.peer_ids[1], b"default name")
    # A certificate of its own, issued by the cluster's CA with `myriad cert issue`.
    name = f"app-{os.getpid()}"
    run_myriad("cert", "issue", tls, name, "--role", "client")
    assert (tls / f"{name}.key").stat().st_mode & 0o777 == 0o600
    with myriad.Client.connect(
        superpeers=tls_cluster.superpeers,
        secret_file=tls_cluster.secret_file,
        tls_dir=str(tls),
        tls_name=name,
    ) as client:
        assert client.get(cid) == b"default name"
        client.put(cid, b"own certs!!!")
        assert client.get(cid) == b"own certs!!!"


def test_plaintext_and_foreign_ca_clients_are_refused_and_the_cluster_serves_on(
    tls_cluster, tmp_path
):
    with tls_cluster.connect(timeout=5.0) as served:
        cid = put_get(served, tls_cluster.peer_ids[0], b"before")
        # No TLS at all: the secret alone does not let a client in.
        with pytest.raises(myriad.MyriadError):
            myriad.Client.connect(
                superpeers=tls_cluster.superpeers,
                secret_file=tls_cluster.secret_file,
                connect_timeout=REFUSED_JOIN_TIMEOUT,
            )
        # A client certificate of another CA (same names, same role): refused.
        foreign = tmp_path / "foreign"
        run_myriad("cert", "ca", foreign)
        run_myriad("cert", "issue", foreign, "client", "--role", "client")
        with pytest.raises(myriad.MyriadError):
            myriad.Client.connect(
                superpeers=tls_cluster.superpeers,
                secret_file=tls_cluster.secret_file,
                tls_dir=foreign,
                connect_timeout=REFUSED_JOIN_TIMEOUT,
            )
        # The right certificates with the wrong secret: TLS alone does not let it in either.
        with pytest.raises(myriad.MyriadError, match="authentication"):
            myriad.Client.connect(
                superpeers=tls_cluster.superpeers,
                secret="not the cluster secret",
                tls_dir=tls_cluster.tls_dir,
                connect_timeout=REFUSED_JOIN_TIMEOUT,
            )
        served.put(cid, b"after!")
        assert served.get(cid) == b"after!"


def test_a_tls_connection_without_a_client_certificate_gets_no_greeting(tls_cluster):
    """Python's own TLS stack (not the Rust client) against a superpeer: the server's
    certificate verifies against the cluster CA under the name ``node.myriad``, and a
    connector that presents no certificate is cut off before the node's greeting."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cafile=str(tls_cluster.tls_dir / "ca.pem"))
    host, port = tls_cluster.superpeers[0].split("@", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5.0) as raw:
        with context.wrap_socket(raw, server_hostname="node.myriad") as tls:
            # TLS 1.3: the client's side of the handshake ends before the server checked
            # the (missing) certificate; the refusal arrives as an alert on the next read.
            tls.sendall(bytes(32))
            received = b""
            with pytest.raises((ssl.SSLError, ConnectionError)):
                while len(received) < 32:
                    chunk = tls.recv(32 - len(received))
                    if not chunk:
                        raise ConnectionError("closed by the node")
                    received += chunk
            assert len(received) < 32, "a node greeted a connector without a certificate"


def test_tls_arguments_are_checked_before_dialing(tls_cluster, tmp_path):
    common = dict(superpeers=tls_cluster.superpeers, secret_file=tls_cluster.secret_file)
    with pytest.raises(ValueError, match="tls_dir"):
        myriad.Client.connect(tls_name="client", **common)
    with pytest.raises(ValueError, match="TLS"):
        myriad.Client.connect(tls_dir=tls_cluster.tls_dir, tls_name="nobody", **common)
    with pytest.raises(ValueError, match="TLS"):
        myriad.Client.connect(tls_dir=tmp_path, **common)


def test_myriad_cluster_start_tls_and_connect_by_cluster_directory(tmp_path):
    directory = tmp_path / "c"
    try:
        out = run_myriad(
            "cluster", "start", "--dir", directory, "--peers", "1", "--peer-memory-mb", "64",
            "--tls",
        ).stdout
        assert "TLS directory" in out, out
        with myriad.Client.connect(cluster_dir=directory, timeout=5.0) as client:
            peer = client.peers()[0]
            put_get(client, peer, b"cli cluster")
        with pytest.raises(myriad.MyriadError):
            myriad.Client.connect(
                superpeers=[line.split(": ", 1)[1] for line in out.splitlines()
                            if line.startswith("superpeers: ")][0],
                secret_file=directory / "secret",
                connect_timeout=REFUSED_JOIN_TIMEOUT,
            )
    finally:
        if (directory / "cluster.json").exists():
            run_myriad("cluster", "stop", "--dir", directory, "--timeout-secs", "5")
