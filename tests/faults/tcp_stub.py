"""A TCP listener on loopback that is not a server: ``reset`` accepts each connection and
resets it (SO_LINGER 0), ``hold`` accepts and never answers. Prints its port, then serves
until killed. Run: ``python tcp_stub.py reset|hold``."""
from __future__ import annotations

import socket
import struct
import sys
import time


def main(behaviour: str) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    print(srv.getsockname()[1], flush=True)
    held = []
    while True:
        conn, _ = srv.accept()
        if behaviour == "reset":
            time.sleep(0.05)  # the request has been sent: the reset meets the reader
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        else:
            held.append(conn)


if __name__ == "__main__":
    main(sys.argv[1])
