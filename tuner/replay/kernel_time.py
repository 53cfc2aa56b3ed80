"""Kernel receive timestamps for asyncio connections (Linux ``SO_TIMESTAMPNS``).

A Python event loop serving 256 streams reads each socket some milliseconds after its
bytes arrived when a burst of chunks comes in at once. Timing a chunk by the kernel's own
receive stamp removes that delay from the measurement, on the client (chunk arrival) and
in ``tuner sim-serve`` (request arrival). Used through :func:`kernel_stamps`, which swaps
the transport's socket for :class:`KernelStampedSocket` (asyncio's selector transports
keep it in ``_sock``); anywhere that is not possible the callers fall back to
``time.perf_counter()`` at read time.
"""
from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

#: Linux's SO_TIMESTAMPNS (asm-generic/socket.h; Python's socket module lacks the name):
#: the kernel stamps each received packet, and recvmsg returns the stamp (SCM_TIMESTAMPNS).
SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None


class KernelStampedSocket:
    """Stands in for a connection's socket inside asyncio's transport: ``recv`` also reads
    the kernel's receive time of the data (SO_TIMESTAMPNS), so a chunk's arrival time does
    not depend on when this busy event loop got round to reading it. Everything else goes
    to the real socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._real = sock
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._space = socket.CMSG_SPACE(16)
        self._offset = time.time() - time.perf_counter()  # realtime → perf_counter
        self.last_stamp: float | None = None

    def _stamp(self, ancillary) -> None:
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = struct.unpack("qq", payload[:16])
                self.last_stamp = min(sec + nsec * 1e-9 - self._offset, time.perf_counter())

    def recv(self, n: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self._real.recvmsg(n, self._space, flags)
        self._stamp(ancillary)
        return data

    def recv_into(self, buf, n: int = 0, flags: int = 0) -> int:
        view = memoryview(buf)
        nbytes, ancillary, _, _ = self._real.recvmsg_into([view[:n] if n else view], self._space, flags)
        self._stamp(ancillary)
        return nbytes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def kernel_stamps(transport: Any) -> KernelStampedSocket | None:
    """Install (once per connection) the stamping socket under an asyncio transport;
    None where that is not possible (not Linux, uvloop, TLS, no transport)."""
    if SO_TIMESTAMPNS is None or transport is None:
        return None
    sock = getattr(transport, "_sock", None)
    if isinstance(sock, KernelStampedSocket):
        return sock
    if type(sock) is not socket.socket or not hasattr(sock, "recvmsg"):
        return None
    try:
        stamped = KernelStampedSocket(sock)
    except OSError:
        return None
    transport._sock = stamped
    return stamped
