"""Exceptions of the Myriad client, one per kind of the Rust client's ``ClientError``.

Every exception derives from :class:`MyriadError` and carries:

``kind``
    the error kind (``"not_found"``, ``"timeout"``, ...), as in ``ClientError``;
``cid``
    the chunk ID concerned, if any (``NotFoundError``, ``LockTimeoutError``);
``node``
    the node concerned, if any (``NodeUnavailableError``, ``OutOfSpaceError``,
    ``ServerError``);
``timeout_ms``
    the timeout that passed (``TimeoutError``);
``index``
    for batch calls, the index of the item that failed (the first failed one).

Where a built-in exception means the same, the class derives from it too, so
``except TimeoutError`` (the built-in) or ``except KeyError`` also catch them.
"""

import builtins

__all__ = [
    "MyriadError",
    "NotFoundError",
    "NodeUnavailableError",
    "TimeoutError",
    "SuperpeersUnavailableError",
    "MetaError",
    "OutOfSpaceError",
    "LockTimeoutError",
    "InvalidArgumentError",
    "ProtocolError",
    "ServerError",
    "JoinError",
    "ShutdownError",
]


class MyriadError(Exception):
    """Base class of every error a Myriad call raises."""

    kind: str = "unknown"
    cid = None
    node = None
    timeout_ms = None
    index = None

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.kind


class NotFoundError(MyriadError, KeyError):
    """The chunk does not exist (never created, or removed)."""


class NodeUnavailableError(MyriadError, ConnectionError):
    """The node owning the chunk (or the node addressed) is unreachable or failed."""


class TimeoutError(MyriadError, builtins.TimeoutError):  # noqa: A001 (mirrors the kind)
    """No answer within the call's timeout."""


class SuperpeersUnavailableError(MyriadError, ConnectionError):
    """No superpeer answered, or the superpeer group has no leader."""


class MetaError(MyriadError):
    """The superpeer group refused the request (e.g. a name or barrier that does not exist)."""


class OutOfSpaceError(MyriadError):
    """The owner cannot store the chunk: out of memory, or larger than a chunk may be."""


class LockTimeoutError(TimeoutError):
    """A chunk lock was not granted within its wait."""


class InvalidArgumentError(MyriadError, ValueError):
    """An argument was refused (by this client before sending, or by a node)."""


class ProtocolError(MyriadError):
    """A server answered with something this client does not understand."""


class ServerError(MyriadError):
    """A node failed the request for a reason of its own."""


class JoinError(MyriadError, ConnectionError):
    """Joining the cluster failed."""


class ShutdownError(MyriadError):
    """The client was closed."""
