"""Python client of Myriad, a distributed in-memory key-value store.

The calls are those of the Rust client library (``myriad-client``), bound with PyO3:

* :class:`Client` -- blocking calls; each waits with the GIL released, so threads scale.
  ``Client.connect(cluster_dir=...)`` or ``Client.connect(superpeers=[...], secret=...)``
  (or ``secret_file=``). There is no default secret: a cluster directory's secret file,
  ``secret=``, ``secret_file=`` or the file named by ``MYRIAD_SECRET_FILE``.
  TLS: ``tls_dir=`` (a directory of ``myriad cert``) and ``tls_name=`` (default
  ``"client"``); a cluster directory of a cluster started with ``--tls`` brings its own.
* :class:`AsyncClient` -- the same calls returning awaitables (``client.aio``, or
  ``await connect_async(...)``).
* numpy batch calls (``create_array``, ``get_array``, ``get_packed``, ``put_array``,
  ``remove_array``): CIDs as a ``uint64`` array, values as one contiguous buffer.
* :func:`local_cluster` -- a local cluster of ``myriad`` processes as a context manager.
* :mod:`myriad.errors` -- one exception class per error kind of the Rust client.

Every call takes ``timeout=`` (seconds; default the client's, 2 s); changing calls take
``durability=`` (``"default"``, ``"async"``, ``"replicated"`` or ``"durable"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Union

from . import errors
from ._myriad import DURABILITY_LEVELS, AsyncClient, ChunkLock, Client
from ._myriad import LocalCluster as _LocalCluster
from .errors import *  # noqa: F401,F403 (the exception classes are part of the API)

__all__ = [
    "Client",
    "AsyncClient",
    "ChunkLock",
    "LocalCluster",
    "DURABILITY_LEVELS",
    "connect",
    "connect_async",
    "local_cluster",
    "find_binary",
    "errors",
] + errors.__all__


def connect(**kwargs) -> Client:
    """Same as :meth:`Client.connect`."""
    return Client.connect(**kwargs)


async def connect_async(**kwargs) -> AsyncClient:
    """Joins the cluster without blocking the event loop; returns the async client.

    Takes the arguments of :meth:`Client.connect`.
    """
    client = await asyncio.to_thread(Client.connect, **kwargs)
    return client.aio


def find_binary(binary: Optional[Union[str, os.PathLike]] = None) -> Path:
    """The ``myriad`` binary to run nodes with.

    In order: ``binary``; the environment variable ``MYRIAD_BIN``; the newest
    ``target/release/myriad`` or ``target/debug/myriad`` of a Myriad checkout at or above
    the current directory; ``myriad`` on ``PATH``. Raises ``FileNotFoundError`` if none.
    """
    if binary is not None:
        return Path(binary)
    env = os.environ.get("MYRIAD_BIN")
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for directory in [here, *here.parents]:
        candidates = [
            directory / "target" / profile / "myriad" for profile in ("release", "debug")
        ]
        found = [path for path in candidates if path.is_file()]
        if found:
            return max(found, key=lambda path: path.stat().st_mtime)
    on_path = shutil.which("myriad")
    if on_path:
        return Path(on_path)
    raise FileNotFoundError(
        "no myriad binary: pass binary=, set MYRIAD_BIN, or build it with "
        "`cargo build -p myriad` in the repository"
    )


class LocalCluster:
    """A running local cluster started by :func:`local_cluster`.

    Attributes: ``dir`` (its directory), ``superpeers`` (``["ID@HOST:PORT", ...]``),
    ``peer_ids``, ``secret`` and ``secret_file`` (the cluster secret and its file),
    ``tls_dir`` (its certificates, or ``None`` without TLS).
    """

    def __init__(self, inner: _LocalCluster):
        self._inner = inner

    @property
    def dir(self) -> Path:
        """The cluster directory (``cluster.json``, ``logs/``, ``data/``)."""
        return Path(self._inner.dir)

    @property
    def superpeers(self) -> list:
        """The superpeers as ``"ID@HOST:PORT"`` strings."""
        return self._inner.superpeers

    @property
    def peer_ids(self) -> list:
        """The peers' node IDs."""
        return self._inner.peer_ids

    @property
    def secret(self) -> str:
        """The cluster secret, read from :attr:`secret_file`."""
        return self._inner.secret

    @property
    def secret_file(self) -> Path:
        """The cluster secret's file (mode 0600; ``dir / "secret"`` unless one was given)."""
        return Path(self._inner.secret_file)

    @property
    def tls_dir(self) -> Optional[Path]:
        """The TLS directory of a cluster started with ``tls=True`` (``dir / "tls"``: the CA
        and the ``superpeer``, ``peer`` and ``client`` certificates), else ``None``."""
        tls = self._inner.tls_dir
        return None if tls is None else Path(tls)

    def connect(self, **kwargs) -> Client:
        """A client of this cluster (keyword arguments of :meth:`Client.connect`)."""
        return Client.connect(cluster_dir=str(self.dir), **kwargs)

    def nodes(self) -> list:
        """Every node: ``name``, ``role``, ``node_id``, ``address``, ``pid``, ``alive``, ``log``."""
        return self._inner.nodes()

    def kill(self, node: Union[int, str]) -> None:
        """SIGKILLs one node (by ID or name such as ``"peer-2"``): a failure drill."""
        self._inner.kill(node)

    def restart(self, node: Union[int, str]) -> None:
        """Restarts one node with its arguments and data; returns once it serves."""
        self._inner.restart(node)

    def stop(self, timeout: float = 10.0) -> list:
        """Stops every node (SIGTERM, SIGKILL after ``timeout`` s)."""
        return self._inner.stop(timeout)

    def __repr__(self) -> str:
        return f"<myriad.LocalCluster dir={self.dir} peers={self.peer_ids}>"


@contextlib.contextmanager
def local_cluster(
    peers: int = 3,
    superpeers: int = 1,
    *,
    dir: Optional[Union[str, os.PathLike]] = None,
    binary: Optional[Union[str, os.PathLike]] = None,
    peer_memory_mb: Optional[int] = 256,
    secret: Optional[str] = None,
    secret_file: Optional[Union[str, os.PathLike]] = None,
    config: Optional[Union[str, os.PathLike]] = None,
    ready_timeout: float = 60.0,
    keep_dir: bool = False,
    tls: bool = False,
) -> Iterator[LocalCluster]:
    """Starts a local cluster of ``myriad`` processes; stops it on exit.

    ``peers`` peers and ``superpeers`` superpeers (1, 3 or 5) on 127.0.0.1, each a child
    process of the binary from :func:`find_binary`. Files go to ``dir`` (default: a new
    temporary directory, removed on exit unless ``keep_dir``). The nodes also exit if this
    Python process dies.

    The cluster secret is never on a command line: ``secret`` is written to
    ``dir/secret`` (mode 0600), ``secret_file`` names a file of your own (mode 0600), and
    with neither the launcher keeps ``dir/secret`` or creates it with a random secret.
    Every node gets the file's path; :meth:`LocalCluster.connect` reads it.

    With ``tls=True`` every connection runs over TLS (as ``myriad cluster start --tls``):
    the cluster CA and the ``superpeer``, ``peer`` and ``client`` certificates are made in
    ``dir/tls`` (kept if there), and :meth:`LocalCluster.connect` uses ``client``.

    >>> with myriad.local_cluster(peers=3) as cluster:          # doctest: +SKIP
    ...     with cluster.connect() as client:
    ...         cid = client.create_with_data(cluster.peer_ids[0], [b"hello"])[0]
    ...         assert client.get(cid) == b"hello"
    """
    path = find_binary(binary)
    made = dir is None
    directory = Path(tempfile.mkdtemp(prefix="myriad-cluster-")) if made else Path(dir)
    try:
        inner = _LocalCluster.start(
            str(directory),
            str(path),
            superpeers=superpeers,
            peers=peers,
            peer_memory_mb=peer_memory_mb,
            secret=secret,
            secret_file=None if secret_file is None else str(secret_file),
            config=None if config is None else str(config),
            ready_timeout=ready_timeout,
            tls=tls,
        )
        cluster = LocalCluster(inner)
        try:
            yield cluster
        finally:
            inner.stop(5.0)
    finally:
        if made and not keep_dir:
            shutil.rmtree(directory, ignore_errors=True)
