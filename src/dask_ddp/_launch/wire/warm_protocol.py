"""What crosses the sockets between a worker and its warm template (internal).

The worker (:mod:`dask_ddp._launch.worker.warm`) sends a :class:`StartRequest` per rank
with its file descriptors; the template (:mod:`dask_ddp._launch.rank.warm_template`)
answers with :class:`Reply` messages and reaps a rank once told (:class:`Reap`).
"""

from __future__ import annotations

import dataclasses
import pickle
import socket
from typing import Any

_MAX_MESSAGE = 1 << 20


@dataclasses.dataclass(frozen=True)
class StartRequest:
    """Start one rank; sent with its fds: rank connection, channel, stdout, stderr."""

    env: dict[str, str]
    cwd: str
    workdir: str
    channel_fd: int
    affinity: tuple[int, ...] | None


@dataclasses.dataclass(frozen=True)
class Reply:
    """From a template: ``ready`` (on its control socket), and on a rank connection
    ``started`` (``pid``), ``refused`` (``message``), ``exited`` (``code``, not reaped
    yet) and ``reaped`` (``code``). ``code`` is a Popen return code (``-N``: signal N)."""

    kind: str
    pid: int = 0
    code: int = 0
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Reap:
    """To a template, on a rank connection: reap the rank once it exited."""


def send(sock: socket.socket, message: object, fds: list[int] | None = None) -> None:
    data = pickle.dumps(message)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def recv(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message and its fds; ``(None, [])`` when the peer closed its end."""
    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 8)
    return (pickle.loads(data) if data else None), fds
