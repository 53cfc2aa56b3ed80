"""Kernel receive stamps: a chunk read late keeps the time it arrived."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from tuner.replay.kernel_time import KernelStampedSocket, kernel_stamps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")


def test_data_read_late_is_stamped_when_it_arrived():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = socket.create_connection(srv.getsockname())
        peer, _ = srv.accept()
        with client, peer:
            stamped = KernelStampedSocket(client)
            peer.sendall(b"first")
            sent = time.perf_counter()
            time.sleep(0.05)  # the reader is busy elsewhere
            assert stamped.recv(100) == b"first"
            read = time.perf_counter()
            assert stamped.last_stamp is not None
            assert stamped.last_stamp < sent + 0.01 < read - 0.03
            buf = bytearray(16)
            peer.sendall(b"second")
            time.sleep(0.01)
            assert stamped.recv_into(buf) == 6 and bytes(buf[:6]) == b"second"
            assert stamped.last_stamp > sent
            assert stamped.getsockname() == client.getsockname()  # the rest goes to the socket


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
