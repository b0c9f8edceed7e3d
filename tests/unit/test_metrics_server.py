"""The metrics port from the attacker's side (slonk.metrics.server), a real server on this
machine: a flood of idle connections, a slowloris, an oversized request. The server's threads
and descriptors stay bounded, idle clients are cut, and a scrape still answers."""

from __future__ import annotations

import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from slonk.agent.runner import Board, Runner, Task
from slonk.metrics import serve
from slonk.metrics.collector import SourcesCollector
from slonk.metrics.server import DEFAULT_LIMITS, Limits, MetricsServer, source_of

LONG = 60.0  # a bound that only a broken test reaches: every wait below ends on its cause
FLOOD = 2000  # idle connections, as in issue 28


@contextmanager
def running(limits: Limits = DEFAULT_LIMITS, address: str = "127.0.0.1") -> Iterator[MetricsServer]:
    """A server on a free port, serving its own counts (fresh at every scrape)."""
    server = MetricsServer(address, 0, limits, print)
    registry = CollectorRegistry()
    registry.register(SourcesCollector({"server": server.families}, fresh=0))
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(registry, stop), name="test-metrics")
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(LONG)


@contextmanager
def descriptors(needed: int) -> Iterator[int]:
    """Room for `needed` more descriptors in this process (the soft limit raised within the
    hard one, as root or not), put back after; how many fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _open_fds() + needed + 100
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield max(0, min(needed, max(soft, want) - _open_fds() - 100))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def scrape(host: str, port: int, source: str = "") -> dict[str, float]:
    """/metrics as Prometheus reads it, from `source` (an address of this machine); {sample
    name with its labels: value}."""
    bound = (source, 0) if source else None
    with socket.create_connection((host, port), timeout=LONG, source_address=bound) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    if not answer:  # the server closed the connection, unanswered (a reset says the same)
        raise ConnectionAbortedError(f"{host}:{port} closed the connection unanswered")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def flood(port: int, count: int, burst: int = 100) -> list[socket.socket]:
    """`count` connections that never send a byte, made as a job would: `burst` connects
    started at once, then waited on, and the next."""
    held: list[socket.socket] = []
    while len(held) < count:
        batch = [socket.socket() for _ in range(min(burst, count - len(held)))]
        for sock in batch:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
        with selectors.DefaultSelector() as selector:
            for sock in batch:
                selector.register(sock, selectors.EVENT_WRITE)
            left = len(batch)
            while left:  # every one writable: connected (or refused: asserted below)
                ready = selector.select(LONG)
                assert ready, f"{left} connections not made in {LONG} s"
                for key, _ in ready:
                    selector.unregister(key.fileobj)
                    left -= 1
        assert not any(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) for s in batch)
        held += batch
    return held


def wait_closed(socks: list[socket.socket], until: int) -> set[socket.socket]:
    """Wait until at least `until` of `socks` read end-of-file (or a reset): the server closed
    them. The set of those closed."""
    closed: set[socket.socket] = set()
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + LONG
        while len(closed) < until and time.monotonic() < deadline:
            for key, _ in selector.select(deadline - time.monotonic()):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1)
                except BlockingIOError:
                    continue
                except ConnectionError:
                    data = b""
                assert data == b"", data  # an idle client is never answered
                selector.unregister(sock)
                closed.add(sock)
    return closed


def _other_address() -> str:
    """An address of this machine that is not loopback (a Prometheus elsewhere), or ""."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: the route picks the address
        except OSError:
            return ""
        address = probe.getsockname()[0]
    return "" if source_of(address) == "loopback" else address


def test_two_thousand_idle_connections_get_no_thread_and_hold_no_descriptor():
    limits = DEFAULT_LIMITS
    threads_before = threading.active_count()
    with descriptors(FLOOD) as room, running(limits) as server:
        count = min(FLOOD, room)
        assert count >= 4 * limits.connections, f"too few descriptors for a flood: {room}"
        fds_before = _open_fds()
        socks = flood(server.port, count)
        flooded = time.monotonic()
        try:
            # All but what one source may hold are closed as they come.
            closed = wait_closed(socks, count - limits.per_source)
            held = [s for s in socks if s not in closed]
            # The flood holds: the server's threads are its loop and its workers (and the
            # scrape's reader, started per scrape), its descriptors a listener and a selector
            # beyond the connections it holds.
            assert threading.active_count() <= threads_before + 1 + limits.workers + 1
            assert _open_fds() - fds_before - count <= limits.per_source + 2
            assert 0 < len(held) <= limits.per_source
            # The held ones are cut head_seconds after their accept: they read EOF.
            assert len(wait_closed(held, len(held))) == len(held)
            assert time.monotonic() - flooded < limits.head_seconds + 2.0
        finally:
            for sock in socks:
                sock.close()
        found = scrape("127.0.0.1", server.port)
    refused = "slonk_exporter_connections_refused_total"
    assert found[refused + "[('reason', 'busy')]"] == count - len(held)
    assert found[refused + "[('reason', 'slow')]"] == len(held)


def test_a_scrape_from_elsewhere_answers_while_a_flood_from_the_node_holds():
    other = _other_address()
    if not other:
        pytest.skip("this machine has no address but loopback")
    limits = DEFAULT_LIMITS
    with descriptors(FLOOD) as room, running(limits, address="0.0.0.0") as server:
        socks = flood(server.port, min(FLOOD // 4, room))
        try:
            wait_closed(socks, len(socks) - limits.per_source)
            asked = time.monotonic()
            found = scrape(other, server.port, source=other)
            took = time.monotonic() - asked
        finally:
            for sock in socks:
                sock.close()
    assert took < limits.head_seconds  # answered at once, not after the flood's timeout
    # The flood's held connections and the scrape's own: the flood was not cut to answer.
    assert found["slonk_exporter_connections[]"] == limits.per_source + 1


def test_every_connection_held_leaves_scrapes_answered_after_the_head_timeout():
    """Many sources together fill `connections`: one more is closed at once, and the held ones
    are cut after `head_seconds`, so the next scrape answers."""
    limits = Limits(connections=16, per_source=16)
    with running(limits) as server:
        socks = flood(server.port, 100)
        try:
            closed = wait_closed(socks, 100 - 16)
            held = [s for s in socks if s not in closed]
            assert len(held) == 16  # made well within head_seconds: none cut yet
            with pytest.raises(ConnectionError):
                scrape("127.0.0.1", server.port)  # over the cap: closed unanswered
            wait_closed(held, 16)
        finally:
            for sock in socks:
                sock.close()
        assert scrape("127.0.0.1", server.port)["slonk_exporter_connections[]"] == 1


def test_a_slowloris_dribbling_its_headers_is_cut_at_the_head_timeout():
    limits = Limits(head_seconds=1.0)
    with running(limits) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=LONG)
        connected = time.monotonic()
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        sent = 0
        try:
            # A byte of a header, then wait for the server's close a little: the attack's pace.
            while not wait_closed_within(sock, 0.1):
                sock.sendall(b"X")
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            sock.close()
        cut = time.monotonic() - connected
    # The server counts from its accept, which can come a moment before `connect` returns
    # here: a cut 1.4 ms short of the timeout was seen. Early means by a dribble's pause.
    assert limits.head_seconds - 0.1 <= cut < limits.head_seconds + 2.0
    assert sent < limits.head_bytes  # cut by time, not size


def wait_closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_an_oversized_request_is_refused_before_it_is_read_whole():
    with running() as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=LONG) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20000)
            answer = sock.recv(4096)
        found = scrape("127.0.0.1", server.port)
    assert answer.startswith(b"HTTP/1.0 431 ")
    assert found["slonk_exporter_connections_refused_total[('reason', 'large')]"] == 1


def test_other_methods_and_paths_get_prometheus_clients_answers():
    with running() as server:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as posted:
            urllib.request.urlopen(urllib.request.Request(url, b"x", method="POST"), timeout=LONG)
        with urllib.request.urlopen(url, timeout=LONG) as answer:
            assert answer.status == 200 and b"slonk_exporter_connections" in answer.read()
    assert posted.value.code == 501


def test_connections_leave_the_process_three_quarters_of_its_descriptors():
    """Under a small descriptor limit the server's own cap shrinks to a quarter of it."""
    code = (
        "import resource; from slonk.metrics.server import Limits, fitted; "
        "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard)); "
        "print(fitted(Limits(connections=32, per_source=24)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "connections=16, per_source=16" in out.stdout


def test_every_loopback_address_is_one_source():
    assert {source_of(a) for a in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.2")} == {
        "loopback"
    }
    assert source_of("10.0.0.7") == source_of("::ffff:10.0.0.7") == "10.0.0.7"


def test_the_agent_serves_its_tasks_failures(tmp_path, monkeypatch):
    """The metrics task, run by the agent's runner beside a task that keeps failing, serves
    that task's failures and that it is not running between tries."""
    monkeypatch.setenv("POD_NAME", "slonk-cpu-0")
    with socket.socket() as probe:  # a free port for the task, which binds it itself
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stop, board, lines = threading.Event(), Board(), []
    failed_twice = threading.Event()

    def broken(stop: threading.Event) -> None:
        if board.snapshot()["broken"].failures == 1:
            failed_twice.set()
        raise OSError(24, "Too many open files")

    def metrics(stop: threading.Event) -> None:
        serve.serve("worker", port, stop, tmp_path / "cluster.yaml", "127.0.0.1", board)

    tasks = [Task("broken", broken), Task("metrics", metrics)]
    runner = Runner(tasks, stop, lines.append, first_backoff=0.001, max_backoff=LONG, board=board)
    runner.start()
    try:
        assert failed_twice.wait(LONG)
        found = wait_scrape(port)
    finally:
        stop.set()
        assert runner.join(LONG) == []
    assert found["slonk_agent_task_failures_total[('task', 'broken')]"] >= 2
    assert found["slonk_agent_task_up[('task', 'metrics')]"] == 1
    assert found["slonk_agent_task_last_failure_timestamp_seconds[('task', 'broken')]"] > 0
    assert found["slonk_agent_task_failures_total[('task', 'metrics')]"] == 0


def wait_scrape(port: int) -> dict[str, float]:
    """The first scrape the metrics task answers (it binds as it starts)."""
    deadline = time.monotonic() + LONG
    while True:
        try:
            return scrape("127.0.0.1", port)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
