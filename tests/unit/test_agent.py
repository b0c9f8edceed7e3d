"""slonk agent: its task runner, inotify on a real directory (kubelet's `..data` swap), the
fallback to polling, the per-pod phase of LDAP syncs, whole log lines, and a clean SIGTERM."""

from __future__ import annotations

import collections
import errno
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk.agent import inotify
from slonk.agent.changes import Changes
from slonk.agent.lines import LineWriter
from slonk.agent.runner import Board, Runner, Task
from slonk.base import jitter
from slonk.config.spec import parse_spec
from slonk.local.projection import project
from slonk.pod_agent import tasks_for

SRC = Path(__file__).resolve().parents[2] / "src"


def _python(code: str, **run: Any) -> subprocess.CompletedProcess[str]:
    """`code` run by a new interpreter with this checkout's slonk."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)}, **run,
    )  # fmt: skip


SPEC = {
    "clusterName": "c",
    "release": "slonk",
    "nodepools": {"cpu": {"replicas": 2, "cpus": 4, "memoryMiB": 1024}},
}
LONG = 60.0  # a bound that only a broken test reaches: every wait below ends on its cause


def _no_inotify() -> inotify.Inotify:
    raise OSError(errno.EMFILE, "Too many open files")


# The task runner


def test_a_failing_task_is_logged_counted_and_restarted_with_back_off_while_the_others_run():
    stop, lines, board = threading.Event(), [], Board()
    starts, third_start, steady_ran = [], threading.Event(), threading.Event()

    def flaky(stop: threading.Event) -> None:
        starts.append(1)
        if len(starts) == 3:
            third_start.set()
            stop.wait()
            return
        raise RuntimeError(f"broken {len(starts)}\nsecond line")

    def steady(stop: threading.Event) -> None:
        steady_ran.set()
        stop.wait()

    tasks = [Task("flaky", flaky), Task("steady", steady)]
    runner = Runner(tasks, stop, lines.append, first_backoff=0.001, board=board)
    runner.start()
    assert third_start.wait(LONG) and steady_ran.wait(LONG)
    assert runner.failures == {"flaky": 2}
    states = board.snapshot()
    assert states["flaky"].running and states["flaky"].failures == 2
    assert 0 < states["flaky"].failed <= states["flaky"].started  # running again since
    assert states["steady"].running and states["steady"].failures == 0
    # Each failure is one line: the task, the error (its own line ends folded), where it was
    # raised, and the back-off, which doubles: 1 ms, then 2 ms.
    here = Path(__file__).name
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    for count, (line, wait) in enumerate(zip(lines, ("0.001", "0.002"), strict=True), 1):
        assert line.startswith(
            f"task flaky failed ({count} so far): RuntimeError: broken {count} second line "
            f"(at {here}:"
        ), line
        assert line.endswith(f" in flaky); starts again in {wait} s"), line
    stop.set()
    assert runner.join(LONG) == []
    assert not any(s.running for s in board.snapshot().values())


def test_a_task_that_exits_is_a_failure_too():
    """sys.exit in a task's thread would end that thread unseen: it is counted and restarted."""
    stop, lines, again = threading.Event(), [], threading.Event()

    def exits(stop: threading.Event) -> None:
        if lines:
            again.set()
            stop.wait()
            return
        sys.exit(3)

    runner = Runner([Task("exits", exits)], stop, lines.append, first_backoff=0.001)
    runner.start()
    assert again.wait(LONG)
    stop.set()
    assert runner.join(LONG) == []
    assert runner.failures == {"exits": 1}
    assert lines[0].startswith("task exits failed (1 so far): SystemExit: 3 (at ")


def test_the_agents_task_metrics(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from slonk.metrics.collector import SourcesCollector
    from slonk.metrics.tasks import task_families

    board = Board()
    board.set("hooks", running=True, started=100.0)
    board.failed("users-sync")
    registry = CollectorRegistry()
    registry.register(SourcesCollector({"agent": lambda: task_families(board)}))
    out = generate_latest(registry).decode()
    assert 'slonk_agent_task_up{task="hooks"} 1.0' in out
    assert 'slonk_agent_task_up{task="users-sync"} 0.0' in out
    assert 'slonk_agent_task_failures_total{task="users-sync"} 1.0' in out
    assert 'slonk_agent_task_failures_total{task="hooks"} 0.0' in out
    assert 'slonk_agent_task_start_timestamp_seconds{task="hooks"} 100.0' in out


def test_a_task_that_returns_is_not_started_again():
    stop, runs, lines = threading.Event(), [], []
    task = Task("off", lambda stop: runs.append(1))
    runner = Runner([task], stop, lines.append, first_backoff=0.001)
    runner.start()
    assert runner.join(LONG) == []
    assert runs == [1] and not stop.is_set()
    assert lines == ["task off ended: nothing left to do"]
    assert not runner.board.snapshot()["off"].running


def test_the_back_off_is_capped_and_a_stop_during_it_ends_the_task():
    stop, lines = threading.Event(), []
    capped = threading.Event()

    def log(line: str) -> None:
        lines.append(line)
        if line.endswith("in 0.004 s"):
            capped.set()
        if len(lines) == 5:
            stop.set()

    def broken(stop: threading.Event) -> None:
        raise ValueError("always")

    runner = Runner([Task("broken", broken)], stop, log, first_backoff=0.001, max_backoff=0.004)
    runner.start()
    assert runner.join(LONG) == []
    waits = [line.rsplit(" in ", 1)[1] for line in lines if "starts again" in line]
    assert waits == ["0.001 s", "0.002 s", "0.004 s", "0.004 s", "0.004 s"]


# inotify against a real directory


def test_inotify_sees_kubelets_data_symlink_swap(tmp_path):
    """kubelet (and local mode's projection) writes a new timestamped directory, points
    `..data_tmp` at it and renames that over `..data`: cluster.yaml, a symlink through
    `..data`, changes without any event on its own name. The directory's watch sees it."""
    project(tmp_path, {"cluster.yaml": b"one\n"})
    watcher = inotify.Inotify()
    try:
        watcher.add_watch(tmp_path)
        assert watcher.read() == []
        project(tmp_path, {"cluster.yaml": b"two\n"})
        events = watcher.read()
    finally:
        watcher.close()
    assert any(e.name == "..data" and e.mask & inotify.IN_MOVED_TO for e in events), events
    assert (tmp_path / "cluster.yaml").read_bytes() == b"two\n"


def test_inotify_refuses_a_missing_directory_with_its_errno(tmp_path):
    watcher = inotify.Inotify()
    try:
        with pytest.raises(OSError) as raised:
            watcher.add_watch(tmp_path / "missing")
    finally:
        watcher.close()
    assert raised.value.errno == errno.ENOENT


def test_a_waiter_wakes_on_the_swap_and_on_close(tmp_path):
    project(tmp_path, {"cluster.yaml": b"one\n"})
    lines: list[str] = []
    changes = Changes(lines.append)
    try:
        waiter = changes.waiter(tmp_path, poll_seconds=LONG)
        assert waiter.describe() == f"{tmp_path} (inotify)"
        project(tmp_path, {"cluster.yaml": b"two\n"})
        assert waiter.event.wait(LONG)  # set by the reader thread, on the event
        waiter.wait(LONG)  # returns at once, and clears
        assert not waiter.event.is_set()
    finally:
        changes.close()
    assert waiter.event.is_set()  # closing wakes every waiter: its task sees the stop
    assert lines == []


def test_a_directory_made_later_is_watched_once_it_exists(tmp_path):
    later = tmp_path / "git"
    changes = Changes(print)
    try:
        waiter = changes.waiter(later, poll_seconds=0.001)
        assert waiter.describe() == f"{later} every 0.001 s"
        waiter.wait(LONG)  # polls meanwhile: returns after its poll interval
        later.mkdir()
        waiter.wait(LONG)  # watched from now: returns at once, for a look
        assert waiter.watched
        (later / "hooks").symlink_to(".worktrees/abc")
        assert waiter.event.wait(LONG)
    finally:
        changes.close()


def test_without_inotify_the_waiters_poll_and_it_is_said_once(tmp_path):
    lines: list[str] = []
    changes = Changes(lines.append, make=_no_inotify)
    first = changes.waiter(tmp_path, poll_seconds=0.001)
    second = changes.waiter(tmp_path / "other", poll_seconds=0.001)
    assert first.describe() == f"{tmp_path} every 0.001 s"
    first.wait(LONG)  # returns after the poll interval, not LONG
    second.wait(LONG)
    changes.close()
    assert lines == [
        "inotify unavailable ([Errno 24] Too many open files); polling instead "
        "(fs.inotify.max_user_instances)"
    ]


def test_a_real_emfile_falls_back_to_polling(tmp_path):
    """With every descriptor used, inotify_init1 fails as it does with the user's instances
    used up (both EMFILE): the agent polls."""
    code = (
        "import os, resource\n"
        "from slonk.agent.changes import Changes\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "held = []\n"
        "while True:\n"
        "    try: held.append(os.open('/dev/null', os.O_RDONLY))\n"
        "    except OSError: break\n"
        "changes = Changes(print)\n"
        "print(changes.inotify is None)\n"
    )
    done = _python(code, check=True)
    assert done.stdout.splitlines() == [
        "inotify unavailable ([Errno 24] inotify_init1: Too many open files); polling instead "
        "(fs.inotify.max_user_instances)",
        "True",
    ]


# The per-pod phase of periodic LDAP syncs


@pytest.mark.parametrize("period", [1.0, 60.0, 3600.0])
def test_a_pods_phase_lies_within_the_period_and_keeps_its_slot(period):
    names = [f"slonk-cpu-{i}" for i in range(256)]
    phases = [jitter.phase(n, period) for n in names]
    assert all(0 <= p < period for p in phases)
    assert phases == [jitter.phase(n, period) for n in names]  # a restarted pod: same slot
    for now in (0.0, 1_700_000_000.25, 1_700_000_000.25 + period / 3):
        for offset in phases[:16]:
            slot = jitter.next_slot(now, period, offset)
            assert now < slot <= now + period
            assert (slot - offset) / period == pytest.approx(round((slot - offset) / period))


def test_256_pods_spread_over_a_minute():
    """Not all in one second: 256 pods of a 60 s sync occupy most seconds of the minute."""
    seconds = collections.Counter(int(jitter.phase(f"slonk-cpu-{i}", 60)) for i in range(256))
    assert len(seconds) >= 50
    assert max(seconds.values()) <= 12  # vs 256 at once without a phase


# Whole lines from many threads


def test_threads_writing_pieces_of_lines_never_share_a_line():
    read_end, write_end = os.pipe()
    writer = LineWriter(write_end)
    chunks: list[bytes] = []
    reader = threading.Thread(
        target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b""))
    )
    reader.start()

    def write(letter: str) -> None:
        for _ in range(300):
            for piece in (letter * 10, letter * 20, letter * 30, "\n"):
                writer.write(piece)

    threads = [threading.Thread(target=write, args=(c,)) for c in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.close(write_end)
    reader.join()
    os.close(read_end)
    lines = b"".join(chunks).decode().splitlines()
    assert len(lines) == 1200
    assert all(line == line[0] * 60 for line in lines)


# The tasks of each role, and the agent's life


def _names(spec: dict, role: str, tmp_path: Path) -> list[str]:
    changes = Changes(lambda line: None, make=_no_inotify)
    found = tasks_for(parse_spec(spec), role, "slonk-cpu-0", changes, tmp_path / "cluster.yaml")
    return [t.name for t in found]


LDAP = {"uris": ["ldap://ldap"], "userBase": "ou=people,dc=x", "groupBase": "ou=groups,dc=x"}


def test_each_role_runs_the_loops_its_services_ran(tmp_path):
    # health-active even with active checks off: it lets the block checks' gate open.
    assert _names(SPEC, "controller", tmp_path) == ["config-watch", "health-active"]
    assert _names(SPEC, "worker", tmp_path) == ["config-watch"]
    assert _names(SPEC, "login", tmp_path) == []


def test_a_pinned_srun_port_range_is_kept_on_the_login_and_worker_pods(tmp_path):
    from slonk.init import optional_services

    pinned = {**SPEC, "slurmConf": {"SrunPortRange": "60001-63000"}}
    assert parse_spec(pinned).srun_ports == (60001, 63000)
    assert _names(pinned, "login", tmp_path) == ["srun-ports"]
    assert "srun-ports" in _names(pinned, "worker", tmp_path)
    assert "srun-ports" not in _names(pinned, "controller", tmp_path)
    assert optional_services(parse_spec(pinned), "login") == ("agent",)
    assert parse_spec(SPEC).srun_ports is None  # ephemeral: nothing to keep


def test_the_agents_tasks_as_cluster_yaml_asks(tmp_path, demo_spec):
    demo_spec["metrics"] = {}
    assert _names(demo_spec, "worker", tmp_path)[0] == "config-watch"
    assert "metrics" in _names(demo_spec, "controller", tmp_path)
    assert "metrics" not in _names(demo_spec, "login", tmp_path)


def test_sigterm_stops_the_agent_cleanly(tmp_path):
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(SPEC))
    agent = subprocess.Popen(
        [sys.executable, "-m", "slonk.cli", "agent", "--role", "worker",
         "--cluster", str(tmp_path / "cluster.yaml")],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(SRC), "POD_NAME": "slonk-cpu-0"},
    )  # fmt: skip
    try:
        assert agent.stderr is not None
        said = [agent.stderr.readline().rstrip("\n") for _ in range(2)]
        assert sorted(said) == [
            "slonk agent: worker slonk-cpu-0: config-watch",
            f"slonk watch-config: watching {tmp_path} (inotify)",
        ]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(LONG) == 0
        assert agent.stderr.read() == "slonk agent: stopped\n"
    finally:
        agent.kill()
        agent.wait()


def test_a_signal_while_the_stop_event_is_held_still_stops_the_agent():
    """SIGTERM handled while the main thread holds the stop Event's lock, as it does for a
    moment entering stop.wait(): a handler that set the Event itself waited for ever (seen
    once: an agent that ignored SIGTERM)."""
    script = (
        "import os, signal, threading\n"
        "from slonk.pod_agent import stop_on_signals\n"
        "stop = threading.Event()\n"
        "stop_on_signals(stop)\n"
        "with stop._cond:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    print('handled', flush=True)\n"
        "print('stopped' if stop.wait(30) else 'not stopped')\n"
    )
    done = _python(script, timeout=LONG)
    assert done.stdout.split() == ["handled", "stopped"], done.stderr


def test_the_users_sync_waits_for_its_slot_and_ends_on_stop(monkeypatch, capsys):
    from slonk.users import sync

    waits: list[float] = []

    class Stop(threading.Event):  # stops at the first wait, after noting how long it was
        def wait(self, timeout=None):
            waits.append(timeout)
            return True

    monkeypatch.setattr(sync, "run_once", lambda spec: pytest.fail("synced after the stop"))
    with_ldap = parse_spec({**SPEC, "ldap": {**LDAP, "syncIntervalSeconds": 60}})
    sync.run_forever(lambda: with_ldap, Stop(), "slonk-cpu-7")
    assert len(waits) == 1 and 0 < waits[0] <= 60
    sync.run_forever(lambda: parse_spec(SPEC), Stop(), "slonk-cpu-7")
    assert len(waits) == 1
    assert capsys.readouterr().out == "slonk users: LDAP is not configured; no sync\n"


def test_with_ldap_every_role_syncs_users_and_the_login_pod_runs_an_agent(tmp_path):
    from slonk.init import optional_services

    spec = {**SPEC, "ldap": LDAP}
    assert _names(spec, "controller", tmp_path) == ["config-watch", "users-sync", "health-active"]
    assert _names(spec, "worker", tmp_path) == ["config-watch", "users-sync"]
    assert _names(spec, "login", tmp_path) == ["users-sync"]
    assert optional_services(parse_spec(spec), "login") == ("agent",)
    assert optional_services(parse_spec(SPEC), "login") == ()
