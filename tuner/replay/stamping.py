"""Kernel receive stamps on the replayer's connections: :class:`_StampingConnector` and
:class:`_StampedBuffer` stamp each piece of a response body as it arrives, and
:func:`trace_config` stamps when a request's body is handed to the socket."""
from __future__ import annotations

import collections
import time

import aiohttp

from tuner.runtime.kernel_time import KernelStampedSocket, kernel_stamps


class _StampedBuffer(collections.deque):
    """Stands in for a response StreamReader's buffer: stamps each piece of body as the
    connection's protocol hands it over, with the stream offset it ends at. The stamp is
    the kernel's receive time when the connection has a :class:`KernelStampedSocket`,
    else the time the protocol got the bytes (before the reading task is scheduled).
    Setting ``stamps`` to None stops stamping (once the first chunk is timed)."""

    def __init__(self, items, stamps: collections.deque, kernel: KernelStampedSocket | None) -> None:
        super().__init__(items)
        self.stamps = stamps
        self.kernel = kernel
        self.received = sum(len(x) for x in items)
        if self.received:  # body bytes that came with the headers, before this was installed
            t = kernel.last_stamp if kernel is not None else None
            stamps.append((self.received, t if t is not None else time.perf_counter()))

    def append(self, piece) -> None:
        if self.stamps is not None:
            self.received += len(piece)
            t = self.kernel.last_stamp if self.kernel is not None else None
            self.stamps.append((self.received, t if t is not None else time.perf_counter()))
        super().append(piece)


class _StampingConnector(aiohttp.TCPConnector):
    """A connector whose connections carry kernel receive stamps from their first byte."""

    async def _create_connection(self, req, traces, timeout):  # aiohttp 3.x hook
        proto = await super()._create_connection(req, traces, timeout)
        kernel_stamps(getattr(proto, "transport", None))
        return proto


async def _on_body_sent(session, ctx, params) -> None:
    box = ctx.trace_request_ctx
    if box is not None and box.get("sent") is None:
        box["sent"] = time.perf_counter()


def trace_config() -> aiohttp.TraceConfig:
    """Stamps when a request's body is handed to the socket (``box["sent"]``)."""
    tc = aiohttp.TraceConfig()
    tc.on_request_chunk_sent.append(_on_body_sent)
    return tc
