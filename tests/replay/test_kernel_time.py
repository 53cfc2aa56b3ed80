"""Kernel receive stamps: a chunk read late keeps the time it arrived."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from tuner.runtime.kernel_time import SO_TIMESTAMPNS, KernelStampedSocket, kernel_stamps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")


def _stamping(stamped: KernelStampedSocket, peer: socket.socket) -> None:
    """Exchange a byte until the kernel stamps it: it turns stamping on for the first
    socket that asks a moment later (a deferred work item, slower on a busy machine)."""
    deadline = time.monotonic() + 10
    while True:
        peer.sendall(b".")
        assert stamped.recv(1) == b"."
        if stamped.last_stamp is not None:
            return
        assert time.monotonic() < deadline, "the kernel never stamped a packet"
        time.sleep(0.01)


def test_data_read_late_is_stamped_when_it_arrived():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = socket.create_connection(srv.getsockname())
        peer, _ = srv.accept()
        with client, peer:
            stamped = KernelStampedSocket(client)
            eps = stamped.offset_error_s + 1e-4  # the realtime → perf_counter conversion
            assert stamped.offset_error_s < 1e-3
            _stamping(stamped, peer)
            before = time.perf_counter()
            peer.sendall(b"first")  # on loopback the kernel stamps it inside this call
            sent = time.perf_counter()
            time.sleep(0.05)  # the reader is busy elsewhere (longer on a busy machine)
            assert stamped.recv(100) == b"first"
            read = time.perf_counter()
            # the stamp is when the bytes arrived, not when they were read 50+ ms later
            assert before - eps <= stamped.last_stamp <= sent + eps
            assert read - stamped.last_stamp >= 0.05 - eps
            buf = bytearray(16)
            peer.sendall(b"second")
            sent2 = time.perf_counter()
            time.sleep(0.01)
            assert stamped.recv_into(buf) == 6 and bytes(buf[:6]) == b"second"
            assert read - eps <= stamped.last_stamp <= sent2 + eps
            assert stamped.getsockname() == client.getsockname()  # the rest goes to the socket


def test_a_read_without_a_kernel_stamp_keeps_no_older_stamp():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = socket.create_connection(srv.getsockname())
        peer, _ = srv.accept()
        with client, peer:
            stamped = KernelStampedSocket(client)
            _stamping(stamped, peer)
            client.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 0)  # this socket's reads go unstamped
            peer.sendall(b"late")
            time.sleep(0.01)
            assert stamped.recv(100) == b"late"
            assert stamped.last_stamp is None  # the caller takes its own clock, not the last stamp


def test_installs_once_under_a_transport_and_skips_what_it_cannot_wrap():
    class Transport:
        pass

    with socket.socket() as sock:
        t = Transport()
        t._sock = sock
        first = kernel_stamps(t)
        assert isinstance(first, KernelStampedSocket) and t._sock is first
        assert kernel_stamps(t) is first
    assert kernel_stamps(None) is None
    t2 = Transport()
    t2._sock = object()  # e.g. a TLS or uvloop transport
    assert kernel_stamps(t2) is None
