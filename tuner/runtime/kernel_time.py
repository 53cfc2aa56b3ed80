"""Kernel receive timestamps for asyncio connections (Linux ``SO_TIMESTAMPNS``).

A Python event loop serving 256 streams reads each socket some milliseconds after its
bytes arrived when a burst of chunks comes in at once. Timing a chunk by the kernel's own
receive stamp removes that delay from the measurement, on the client (chunk arrival) and
in ``tuner sim-serve`` (request arrival). Used through :func:`kernel_stamps`, which swaps
the transport's socket for :class:`KernelStampedSocket` (asyncio's selector transports
keep it in ``_sock``); anywhere that is not possible the callers fall back to
``time.perf_counter()`` at read time.

The kernel stamps in ``CLOCK_REALTIME``; :func:`realtime_offset` converts to
``perf_counter`` (``CLOCK_MONOTONIC``) with an offset read between two ``perf_counter``
calls, so a preemption while it is taken cannot shift every stamp of a connection.
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


def realtime_offset(tries: int = 5) -> tuple[float, float]:
    """``(offset, error)``: ``time.time() - time.perf_counter()`` in seconds, and how far
    it can be off. Each try reads the real-time clock between two ``perf_counter`` reads;
    the tightest pair wins (a try the scheduler interrupted is wide and loses), and the
    error is half its width: microseconds, however busy the machine."""
    best: tuple[int, int] | None = None
    for _ in range(tries):
        before = time.perf_counter_ns()
        real = time.time_ns()
        after = time.perf_counter_ns()
        width = after - before
        if best is None or width < best[1]:
            best = (real - (before + after) // 2, width)
    assert best is not None
    return best[0] * 1e-9, best[1] * 0.5e-9


class KernelStampedSocket:
    """Stands in for a connection's socket inside asyncio's transport: ``recv`` also reads
    the kernel's receive time of the data (SO_TIMESTAMPNS), so a chunk's arrival time does
    not depend on when this busy event loop got round to reading it. Everything else goes
    to the real socket.

    ``last_stamp`` is the receive time (``perf_counter`` seconds) of the data the last
    read returned, or None when that read carried no stamp: the kernel turns stamping on
    for the first socket that asks a moment later (a deferred work item), so the first
    bytes may come unstamped; the caller then takes its own clock, never an older stamp.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._real = sock
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._space = socket.CMSG_SPACE(16)
        self._offset, self.offset_error_s = realtime_offset()  # realtime → perf_counter
        self.last_stamp: float | None = None

    def _stamp(self, ancillary) -> None:
        self.last_stamp = None
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
