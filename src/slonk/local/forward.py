"""A TCP relay from the host's loopback into a local cluster's network namespace, as
`kubectl port-forward` reaches into a cluster: for what runs only there (its Prometheus).

    python -m slonk.local.forward NETNS TARGET ADDRESS_FILE [PORT]

listens on 127.0.0.1:PORT (when free; else a port the kernel picks, so that clusters side by
side never collide), then joins NETNS (the listening socket stays on the host's loopback) and
carries each connection to TARGET (host:port) there. Writes "127.0.0.1:<port>" to
ADDRESS_FILE once listening. It runs in NETNS from then on: `slonk local down` ends it with
every other process there.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from pathlib import Path

from slonk.base.files import write_atomically
from slonk.local.network import enter_network

HOST = "127.0.0.1"
CHUNK = 65536


def listen(port: int) -> socket.socket:
    """A listening socket on the host's loopback: `port` if free, else any."""
    for candidate in (port, 0) if port else (0,):
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((HOST, candidate))
        except OSError:
            server.close()
            continue
        server.listen(64)
        return server
    raise OSError(f"no port to listen on at {HOST}")


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """One direction until its end: then the other side hears the end too."""
    with contextlib.suppress(OSError):
        while data := source.recv(CHUNK):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _carry(client: socket.socket, target: tuple[str, int]) -> None:
    with client:
        try:
            upstream = socket.create_connection(target, timeout=10)
        except OSError:
            return  # nothing listens there (yet): the client sees its connection closed
        upstream.settimeout(None)
        with upstream:
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()


def serve(server: socket.socket, target: tuple[str, int]) -> None:
    """Until the listening socket is closed."""
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=_carry, args=(client, target), daemon=True).start()


def main() -> None:
    netns, target, address_file = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    host, _, target_port = target.rpartition(":")
    server = listen(port)
    enter_network(netns)
    write_atomically(address_file, f"{HOST}:{server.getsockname()[1]}\n")
    serve(server, (host, int(target_port)))


if __name__ == "__main__":
    main()
