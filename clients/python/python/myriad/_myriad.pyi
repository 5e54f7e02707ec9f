"""Type hints of the extension module ``myriad._myriad`` (PyO3 bindings over myriad-client).

Conventions of every call: ``timeout`` is seconds (default: the client's, 2 s unless set at
``connect``); ``durability`` of changing calls is ``"default"``, ``"async"``,
``"replicated"``, ``"durable"`` or 0..3. CIDs and node IDs are ints (a CID is
``creator << 48 | local id``). Errors are the classes of :mod:`myriad.errors`.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Awaitable, Literal, Optional, Sequence, Tuple, TypedDict, Union

import numpy as np
import numpy.typing as npt

Durability = Union[Literal["default", "async", "replicated", "durable"], int]
Superpeers = Union[str, Sequence[Union[str, Tuple[int, str]]]]
CidArray = Union[npt.NDArray[np.uint64], Sequence[int], npt.ArrayLike]

DURABILITY_LEVELS: list[str]

class NodeInfo(TypedDict):
    id: int
    role: Literal["superpeer", "peer", "client"]
    address: str
    state: Literal["alive", "failed", "left"]
    failed_epoch: Optional[int]
    rack: int
    switch: int
    capabilities: int
    incarnation: int
    joined_epoch: int
    released: bool

class ClusterStatus(TypedDict):
    node: int
    epoch: int
    leader: Optional[int]
    term: int
    last_log_index: Optional[int]
    last_applied_index: Optional[int]
    members: list[Tuple[int, str]]

class ZoneRecovery(TypedDict):
    owner: int
    zone: int
    state: Literal["pending", "running", "done", "failed", "waiting", "lost"]
    restorer: Optional[int]
    chunks: int
    ms: int
    detail: str

class RecoveryStatus(TypedDict):
    leader: bool
    zones: list[ZoneRecovery]

class BarrierStatus(TypedDict):
    size: int
    round: int
    signed: int
    last_released: list[Tuple[int, int]]

class ChunkLock:
    """A chunk's lock: ``with client.lock(cid):`` or ``async with aio.lock(cid):``.

    Taken on entry (waiting at most ``wait`` s at the owner; ``LockTimeoutError`` if not
    granted), released on exit.
    """

    @property
    def cid(self) -> int: ...
    def __enter__(self) -> int: ...
    def __exit__(self, *args: Any) -> bool: ...
    def __aenter__(self) -> Awaitable[None]: ...
    def __aexit__(self, *args: Any) -> Awaitable[None]: ...

class Client:
    """A blocking connection to a Myriad cluster. Thread-safe; every call waits with the
    GIL released. Use as a context manager, or call :meth:`close`."""

    @staticmethod
    def connect(
        *,
        cluster_dir: Optional[Union[str, os.PathLike[str]]] = None,
        superpeers: Optional[Superpeers] = None,
        secret: Optional[str] = None,
        secret_file: Optional[Union[str, os.PathLike[str]]] = None,
        connect_timeout: float = 10.0,
        timeout: float = 2.0,
        durability: Optional[Durability] = None,
        listen: Optional[str] = None,
        lane_spin: Optional[float] = None,
        tls_dir: Optional[Union[str, os.PathLike[str]]] = None,
        tls_name: Optional[str] = None,
    ) -> Client:
        """Joins the cluster: ``cluster_dir`` (written by ``myriad cluster start`` or
        :func:`myriad.local_cluster`; its secret file is read) or ``superpeers``
        (``["1@127.0.0.1:7000"]`` or ``[(1, "127.0.0.1:7000")]``). The secret:
        ``secret``, else the file ``secret_file`` (mode 0600), else the cluster
        directory's, else the file named by ``MYRIAD_SECRET_FILE``; no default
        (``ValueError`` without one). ``lane_spin`` (seconds, 0 to 0.01; default the Rust
        client's 50 µs; 0 never spins): how long a blocking call that is the only one of
        the process waiting polls for its answer before its thread sleeps. TLS:
        ``tls_dir`` (written by ``myriad cert``: ``ca.pem``, ``NAME.pem``, ``NAME.key``)
        with the certificate ``tls_name`` (default ``"client"``); a ``cluster_dir`` of a
        cluster started with ``--tls`` uses its ``tls`` directory by itself. The HMAC
        handshake with the secret still runs inside TLS."""
    @property
    def node_id(self) -> int:
        """This client's node ID (assigned by the superpeers)."""
    @property
    def aio(self) -> AsyncClient:
        """The asyncio view of this client (same connection)."""
    def close(self) -> None:
        """Waits for calls in flight, then leaves the cluster; later calls raise
        ``ShutdownError``."""
    def __enter__(self) -> Client: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    # chunks
    def create(self, peer: int, size: int, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> int:
        """Creates one zeroed chunk of ``size`` bytes on ``peer``; returns its CID."""
    def create_batch(self, peer: int, sizes: Sequence[int], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> list[int]:
        """Creates zeroed chunks of these sizes on ``peer`` (all or nothing)."""
    def create_with_data(self, peer: int, payloads: Sequence[bytes], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> list[int]:
        """Creates chunks holding these payloads on ``peer`` (all or nothing)."""
    def get(self, cid: int, *, timeout: Optional[float] = None) -> bytes:
        """One chunk's bytes (``NotFoundError`` if it does not exist)."""
    def get_batch(self, cids: Sequence[int], *, timeout: Optional[float] = None) -> list[bytes]:
        """Many chunks' bytes, in order; the first failed item raises (``index`` set)."""
    def put(self, cid: int, data: bytes, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None:
        """Replaces a chunk's bytes (same size as the chunk; see :meth:`resize`)."""
    def put_batch(self, items: Sequence[Tuple[int, bytes]], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None:
        """Replaces many chunks' bytes."""
    def remove(self, cid: int, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    def remove_batch(self, cids: Sequence[int], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    def size(self, cid: int, *, timeout: Optional[float] = None) -> int:
        """A chunk's size in bytes."""
    def read_at(self, cid: int, offset: int, length: int, *, timeout: Optional[float] = None) -> bytes: ...
    def write_at(self, cid: int, offset: int, data: bytes, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    def resize(self, cid: int, size: int, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    def lock(self, cid: int, *, write: bool = True, wait: float = 1.0, timeout: Optional[float] = None) -> ChunkLock:
        """The chunk's lock as a context manager."""
    def lock_acquire(self, cid: int, *, write: bool = True, wait: float = 1.0, timeout: Optional[float] = None) -> None: ...
    def unlock(self, cid: int, *, write: bool = True, timeout: Optional[float] = None) -> None: ...
    # numpy batches: one contiguous buffer, no Python object per item
    def create_array(self, peer: int, values: npt.ArrayLike, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> npt.NDArray[np.uint64]:
        """One chunk per row of ``values`` (any C-contiguous array, rows taken as bytes)."""
    def get_array(self, cids: CidArray, size: int, *, timeout: Optional[float] = None) -> npt.NDArray[np.uint8]:
        """Chunks of exactly ``size`` bytes as one ``(len(cids), size)`` uint8 array; view
        it as your dtype (``.view(np.float64)``)."""
    def get_packed(self, cids: CidArray, *, timeout: Optional[float] = None) -> Tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
        """Chunks of any size: ``(data, offsets)``; chunk i is ``data[offsets[i]:offsets[i+1]]``."""
    def put_array(self, cids: CidArray, values: npt.ArrayLike, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None:
        """Row i of ``values`` (as bytes) into chunk ``cids[i]``."""
    def remove_array(self, cids: CidArray, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    # nameservice
    def name_register(self, name: str, cid: int, *, timeout: Optional[float] = None) -> None: ...
    def name_get(self, name: str, *, timeout: Optional[float] = None) -> Optional[int]: ...
    def name_list(self, *, timeout: Optional[float] = None) -> dict[str, int]: ...
    def name_remove(self, name: str, *, timeout: Optional[float] = None) -> None: ...
    # barriers
    def barrier_alloc(self, size: int, *, timeout: Optional[float] = None) -> int: ...
    def barrier_sign_on(self, id: int, value: int = 0, *, timeout: Optional[float] = None) -> list[Tuple[int, int]]:
        """Signs on and waits (at most ``timeout``) for the round; every ``(node, value)``."""
    def barrier_status(self, id: int, *, timeout: Optional[float] = None) -> Optional[BarrierStatus]: ...
    def barrier_resize(self, id: int, size: int, *, timeout: Optional[float] = None) -> None: ...
    def barrier_free(self, id: int, *, timeout: Optional[float] = None) -> None: ...
    # temporary storage
    def tmp_create(self, name: str, data: bytes, *, timeout: Optional[float] = None) -> None: ...
    def tmp_put(self, name: str, data: bytes, *, timeout: Optional[float] = None) -> None: ...
    def tmp_get(self, name: str, *, timeout: Optional[float] = None) -> Optional[bytes]: ...
    def tmp_remove(self, name: str, *, timeout: Optional[float] = None) -> None: ...
    def tmp_list(self, *, timeout: Optional[float] = None) -> dict[str, int]: ...
    # cluster
    def nodes(self, *, timeout: Optional[float] = None) -> list[NodeInfo]: ...
    def peers(self, *, timeout: Optional[float] = None) -> list[int]: ...
    def status(self, *, timeout: Optional[float] = None) -> ClusterStatus: ...
    def recovery_status(self, *, timeout: Optional[float] = None) -> RecoveryStatus: ...
    # compute (blocking only)
    def run_job(
        self, node: int, name: str, params: Optional[bytes] = None, *, timeout: Optional[float] = None
    ) -> bytes:
        """Runs the job registered as ``name`` on peer ``node`` with raw parameter bytes;
        returns its raw result bytes."""
    def run_task_script(self, group: int, script: str, *, timeout: Optional[float] = None) -> dict[str, Any]:
        """Runs a task script (TOML or JSON) on compute group ``group``; returns ``id``,
        ``end`` (finished/aborted/failed), ``reason`` and ``tasks`` (``task``, ``slaves``,
        ``values`` as bytes, ``micros``, ``skipped``)."""
    def compute_set_role(self, node: int, group: int, role: str) -> None:
        """Gives peer ``node`` the role master, slave or none in ``group``."""
    def compute_group(self, group: int) -> tuple[int, list[int]]:
        """The master and the slaves of compute group ``group``."""

class AsyncClient:
    """The asyncio face of a client: the calls of :class:`Client`, each returning an
    awaitable of the same result. A cancelled awaitable's request still runs to its
    result or timeout."""

    @property
    def node_id(self) -> int: ...
    def close(self) -> None: ...
    def lock(self, cid: int, *, write: bool = True, wait: float = 1.0, timeout: Optional[float] = None) -> ChunkLock: ...
    async def create(self, peer: int, size: int, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> int: ...
    async def create_batch(self, peer: int, sizes: Sequence[int], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> list[int]: ...
    async def create_with_data(self, peer: int, payloads: Sequence[bytes], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> list[int]: ...
    async def get(self, cid: int, *, timeout: Optional[float] = None) -> bytes: ...
    async def get_batch(self, cids: Sequence[int], *, timeout: Optional[float] = None) -> list[bytes]: ...
    async def put(self, cid: int, data: bytes, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def put_batch(self, items: Sequence[Tuple[int, bytes]], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def remove(self, cid: int, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def remove_batch(self, cids: Sequence[int], *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def size(self, cid: int, *, timeout: Optional[float] = None) -> int: ...
    async def read_at(self, cid: int, offset: int, length: int, *, timeout: Optional[float] = None) -> bytes: ...
    async def write_at(self, cid: int, offset: int, data: bytes, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def resize(self, cid: int, size: int, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def lock_acquire(self, cid: int, *, write: bool = True, wait: float = 1.0, timeout: Optional[float] = None) -> None: ...
    async def unlock(self, cid: int, *, write: bool = True, timeout: Optional[float] = None) -> None: ...
    async def create_array(self, peer: int, values: npt.ArrayLike, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> npt.NDArray[np.uint64]: ...
    async def get_array(self, cids: CidArray, size: int, *, timeout: Optional[float] = None) -> npt.NDArray[np.uint8]: ...
    async def get_packed(self, cids: CidArray, *, timeout: Optional[float] = None) -> Tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]: ...
    async def put_array(self, cids: CidArray, values: npt.ArrayLike, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def remove_array(self, cids: CidArray, *, timeout: Optional[float] = None, durability: Optional[Durability] = None) -> None: ...
    async def name_register(self, name: str, cid: int, *, timeout: Optional[float] = None) -> None: ...
    async def name_get(self, name: str, *, timeout: Optional[float] = None) -> Optional[int]: ...
    async def name_list(self, *, timeout: Optional[float] = None) -> dict[str, int]: ...
    async def name_remove(self, name: str, *, timeout: Optional[float] = None) -> None: ...
    async def barrier_alloc(self, size: int, *, timeout: Optional[float] = None) -> int: ...
    async def barrier_sign_on(self, id: int, value: int = 0, *, timeout: Optional[float] = None) -> list[Tuple[int, int]]: ...
    async def barrier_status(self, id: int, *, timeout: Optional[float] = None) -> Optional[BarrierStatus]: ...
    async def barrier_resize(self, id: int, size: int, *, timeout: Optional[float] = None) -> None: ...
    async def barrier_free(self, id: int, *, timeout: Optional[float] = None) -> None: ...
    async def tmp_create(self, name: str, data: bytes, *, timeout: Optional[float] = None) -> None: ...
    async def tmp_put(self, name: str, data: bytes, *, timeout: Optional[float] = None) -> None: ...
    async def tmp_get(self, name: str, *, timeout: Optional[float] = None) -> Optional[bytes]: ...
    async def tmp_remove(self, name: str, *, timeout: Optional[float] = None) -> None: ...
    async def tmp_list(self, *, timeout: Optional[float] = None) -> dict[str, int]: ...
    async def nodes(self, *, timeout: Optional[float] = None) -> list[NodeInfo]: ...
    async def peers(self, *, timeout: Optional[float] = None) -> list[int]: ...
    async def status(self, *, timeout: Optional[float] = None) -> ClusterStatus: ...
    async def recovery_status(self, *, timeout: Optional[float] = None) -> RecoveryStatus: ...

class LocalCluster:
    """A local cluster of ``myriad`` processes (see :func:`myriad.local_cluster`)."""

    @staticmethod
    def start(
        dir: str,
        binary: str,
        *,
        superpeers: int = 1,
        peers: int = 3,
        peer_memory_mb: Optional[int] = None,
        secret: Optional[str] = None,
        secret_file: Optional[str] = None,
        config: Optional[str] = None,
        ready_timeout: float = 60.0,
        tls: bool = False,
    ) -> LocalCluster: ...
    @property
    def dir(self) -> str: ...
    @property
    def secret(self) -> str: ...
    @property
    def secret_file(self) -> str: ...
    @property
    def tls_dir(self) -> Optional[str]: ...
    @property
    def superpeers(self) -> list[str]: ...
    @property
    def peer_ids(self) -> list[int]: ...
    def nodes(self) -> list[dict[str, Any]]: ...
    def kill(self, node: Union[int, str]) -> None: ...
    def restart(self, node: Union[int, str]) -> None: ...
    def stop(self, timeout: float = 10.0) -> list[str]: ...
