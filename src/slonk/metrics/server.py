"""/metrics over HTTP with resources no client can grow (the agent's task `metrics`).

prometheus_client's own server (start_http_server) gives every connection a thread and a
descriptor, with no cap and no timeout: a job holding 2,000 idle connections to a worker made
2,008 threads in its agent and took the descriptors its other tasks (the health watch, the
users sync) needed. Here:

- one thread (the task's own) accepts every connection and reads its request's head,
  non-blocking, through a selector: an idle or slow client costs a descriptor and a few bytes,
  never a thread;
- at most `connections` are held at once, and `per_source` from one address, so that a
  Prometheus elsewhere keeps its room while a job floods from a node; one more is closed as it
  is accepted. Every loopback address is one source (a job on the node may use all of 127/8);
- a head must be whole `head_seconds` after the accept (a client that sends nothing, or
  dribbles a header a byte at a time, is cut then) and no longer than `head_bytes`;
- `workers` threads answer whole requests with prometheus_client's MetricsHandler, and each
  answer must be taken within `send_seconds`.

So the server holds at most `connections` + 2 descriptors (the listener, the selector) and
`workers` + 1 threads, whoever connects; `connections` is lowered to leave the process three
quarters of its descriptor limit. What it refused is counted (`families`).
"""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import queue
import resource
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import MetricsHandler
from prometheus_client.registry import Collector

from slonk.metrics.family import COUNTER, GAUGE, Family

# Connections the kernel holds for the next accept (no descriptor of ours; the kernel caps
# it at net.core.somaxconn). Room for a burst: past it the kernel drops a client's handshake,
# a scrape's among them, and a client the server never saw waits out its own timeout.
BACKLOG = 1024
ACCEPTS_PER_ROUND = 64  # then the heads are read: a flood of connects cannot starve them
PAUSE_SECONDS = 1.0  # the process is out of descriptors: accept nothing for this long
TICK_SECONDS = 0.5  # how soon a stop is seen
# Why a connection was closed unanswered: over a limit as it came, no whole head in time,
# a head too large.
REFUSALS = ("busy", "slow", "large")
LARGE = b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class Limits:
    connections: int = 32
    per_source: int = 8
    workers: int = 2
    head_seconds: float = 3.0
    send_seconds: float = 5.0
    head_bytes: int = 8192


DEFAULT_LIMITS = Limits()


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    address: Any  # as accept() gives it: (host, port) or (host, port, flow, scope)
    source: str
    deadline: float  # time.monotonic() by which its head must be whole
    head: bytearray = field(default_factory=bytearray)


def source_of(host: str) -> str:
    """The address a per-source limit counts under: every loopback address is one."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return "loopback" if ip.is_loopback else str(ip)


def fitted(limits: Limits) -> Limits:
    """`limits` with at most a quarter of the process' descriptors for connections: the
    agent's other tasks keep theirs whoever connects."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or limits.connections <= soft // 4:
        return limits
    share = max(1, soft // 4)
    return replace(limits, connections=share, per_source=min(limits.per_source, share))


def _whole(head: bytearray, new: int) -> bool:
    """Whether the head ends with its blank line; only the bytes just read (and the three
    before them) are searched."""
    tail = bytes(head[-(new + 3) :])
    return b"\r\n\r\n" in tail or b"\n\n" in tail


class _Answer(MetricsHandler):
    """One request whose head the loop read, parsed and answered by prometheus_client's own
    handler (GET only; one request per connection: HTTP/1.0)."""

    def __init__(self, client: _Client, registry: Collector) -> None:
        self.head, self.registry = bytes(client.head), registry
        # The server argument is unused by http.server's handlers.
        super().__init__(client.sock, client.address, None)  # type: ignore[arg-type]

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's reader: the head is read already
        self.rfile = io.BytesIO(self.head)


class MetricsServer:
    """Bound to `address`:`port` at once (an error here is the task's); `serve` until a stop."""

    def __init__(
        self,
        address: str,
        port: int,
        limits: Limits = DEFAULT_LIMITS,
        log: Callable[[str], None] = print,
    ) -> None:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]  # fmt: skip
        self.listener = socket.create_server((address, port), family=family, backlog=BACKLOG)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.limits, self.log = fitted(limits), log
        self.lock = threading.Lock()  # the counts below: the loop and the workers change them
        self.held = 0
        self.sources: Counter[str] = Counter()
        self.refused = dict.fromkeys(REFUSALS, 0)
        self.requests: queue.SimpleQueue[_Client | None] = queue.SimpleQueue()
        self.reading: dict[_Client, None] = {}  # in accept order, so in deadline order

    def families(self) -> list[Family]:
        held = Family("slonk_exporter_connections", GAUGE,
                      "Connections to the metrics port held now.")  # fmt: skip
        refused = Family("slonk_exporter_connections_refused_total", COUNTER,
                         "Connections closed unanswered: over the limits as they came (busy), "
                         "no whole request in time (slow), a request too large (large).",
                         ("reason",))  # fmt: skip
        with self.lock:
            held.set(self.held)
            for reason, count in self.refused.items():
                refused.set(count, reason)
        return [held, refused]

    def serve(self, registry: Collector, stop: threading.Event) -> None:
        workers = [
            threading.Thread(target=self._work, args=(registry,), name="metrics-http", daemon=True)
            for _ in range(self.limits.workers)
        ]
        for worker in workers:
            worker.start()
        try:
            with selectors.DefaultSelector() as selector:
                self._loop(selector, stop)
        finally:
            self.listener.close()
            for client in list(self.reading):
                self._drop(client)
            self.reading.clear()
            for _ in workers:  # each ends after the requests queued before it
                self.requests.put(None)

    def _loop(self, selector: selectors.BaseSelector, stop: threading.Event) -> None:
        selector.register(self.listener, selectors.EVENT_READ)
        paused_until = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if paused_until and now >= paused_until:
                selector.register(self.listener, selectors.EVENT_READ)
                paused_until = 0.0
            wait = TICK_SECONDS
            if self.reading:
                wait = min(wait, max(0.0, next(iter(self.reading)).deadline - now))
            for key, _ in selector.select(wait):
                if key.fileobj is not self.listener:
                    self._read(key.data, selector)
                elif not self._accept(selector):
                    selector.unregister(self.listener)
                    paused_until = time.monotonic() + PAUSE_SECONDS
            self._expire(selector)

    def _accept(self, selector: selectors.BaseSelector) -> bool:
        """The connections waiting, as many as the limits allow (the others closed at once).
        False when the process is out of descriptors."""
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                sock, address = self.listener.accept()
            except BlockingIOError:
                return True
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log(f"metrics port: not accepting for {PAUSE_SECONDS:g} s: {err}")
                    return False
                continue  # that client is gone already (ECONNABORTED)
            source = source_of(address[0])
            if not self._admit(source):
                sock.close()
                continue
            sock.setblocking(False)
            client = _Client(sock, address, source, time.monotonic() + self.limits.head_seconds)
            selector.register(sock, selectors.EVENT_READ, client)
            self.reading[client] = None
        return True

    def _admit(self, source: str) -> bool:
        with self.lock:
            if (
                self.held >= self.limits.connections
                or self.sources[source] >= self.limits.per_source
            ):
                self.refused["busy"] += 1
                return False
            self.held += 1
            self.sources[source] += 1
            return True

    def _read(self, client: _Client, selector: selectors.BaseSelector) -> None:
        try:
            chunk = client.sock.recv(self.limits.head_bytes + 1 - len(client.head))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went before asking
            self._stop_reading(client, selector)
            self._drop(client)
            return
        client.head += chunk
        if len(client.head) > self.limits.head_bytes:
            self._refuse(client, selector, "large")
            with contextlib.suppress(OSError):
                client.sock.send(LARGE)  # non-blocking: what fits, if anything
            self._drop(client)
        elif _whole(client.head, len(chunk)):
            self._stop_reading(client, selector)
            self.requests.put(client)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self.reading:
            client = next(iter(self.reading))
            if client.deadline > now:
                return
            self._refuse(client, selector, "slow")
            self._drop(client)

    def _refuse(self, client: _Client, selector: selectors.BaseSelector, reason: str) -> None:
        self._stop_reading(client, selector)
        with self.lock:
            self.refused[reason] += 1

    def _stop_reading(self, client: _Client, selector: selectors.BaseSelector) -> None:
        selector.unregister(client.sock)
        del self.reading[client]

    def _drop(self, client: _Client) -> None:
        client.sock.close()
        with self.lock:
            self.held -= 1
            self.sources[client.source] -= 1
            if not self.sources[client.source]:
                del self.sources[client.source]  # the table stays as small as the limits

    def _work(self, registry: Collector) -> None:
        while (client := self.requests.get()) is not None:
            try:
                client.sock.settimeout(self.limits.send_seconds)
                _Answer(client, registry)
            except OSError:
                pass  # the client went, or did not take its answer in time
            except Exception as err:  # a bug answering one request: the next is answered
                self.log(f"metrics port: answering {client.source} failed: {err!r}")
            finally:
                self._drop(client)
