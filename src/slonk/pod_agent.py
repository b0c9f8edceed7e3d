"""The agent of a controller, worker or login pod: which tasks it runs, and its life.

One interpreter instead of one per loop: the modules the loops share (YAML, the spec, Slurm's
parsers) are loaded once, and a pod runs one Python process beside its daemons.

- controller: config-watch (applies the Slurm configuration), the users sync (with accounting:
  `associations`, which also gives each user its association), health-recycle, health-active
  (active checks as Slurm jobs), metrics. The
  syncer stays its own s6 service: it holds a Lease and exits the moment it loses it so that
  only the new leader acts, which would take every other task with it here; an operator stops
  it alone (`s6-svc -d`) to take over by hand; and it alone loads the Kubernetes watch
  machinery.
- worker: config-watch (health plan, job programs), users-sync, hooks, metrics, the health
  watch (slonk.health.watch) where health checks are on, and srun-ports (slonk.pod.srun_ports)
  where SrunPortRange is pinned.
- login: users-sync (its clients fetch what slurmctld runs: nothing else of its own), and
  srun-ports where SrunPortRange is pinned.

The tasks are chosen from cluster.yaml as the agent starts, as the services were at the pod's
start; a feature switched off later ends its task (it said so), one switched on needs a new pod.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from slonk.agent.changes import Changes, Waiter
from slonk.agent.lines import LineWriter
from slonk.agent.runner import Board, Runner, Task
from slonk.base import paths
from slonk.base.identity import pod_name
from slonk.config.spec import ClusterSpec, SpecError, load_spec

ROLES = ("controller", "worker", "login")
# A stopping agent gives its tasks this long to end (a task in a slow call, an LDAP search
# or scontrol, is left behind: its thread ends with the process).
STOP_SECONDS = 5.0


def log(message: str) -> None:
    print(f"slonk agent: {message}", file=sys.stderr, flush=True)


def tasks_for(
    spec: ClusterSpec,
    role: str,
    pod: str,
    changes: Changes,
    spec_path: Path,
    board: Board | None = None,
) -> list[Task]:
    """The role's tasks as cluster.yaml asks for them. Each imports its module when it starts.
    `board`: the runner's, served by the metrics task."""

    def load() -> ClusterSpec:
        return load_spec(spec_path)

    tasks: list[Task] = []
    if role in ("controller", "worker"):
        from slonk.pod import config_watch

        spec_dir = changes.waiter(spec_path.parent, config_watch.POLL_SECONDS)
        follow = lambda stop: config_watch.watch(role, stop, spec_dir, spec_path)  # noqa: E731
        tasks.append(Task("config-watch", follow))
    if role == "controller" and spec.accounting:
        tasks.append(Task("associations", lambda stop: _associations(load, stop)))
    elif spec.ldap:
        tasks.append(Task("users-sync", lambda stop: _users_sync(load, stop, pod)))
    if role == "worker" and spec.hooks:
        tasks.append(_hooks(load, changes))
    if role == "controller" and spec.health and spec.health.recycle:
        tasks.append(Task("health-recycle", lambda stop: _recycle(load, stop)))
    if role == "controller":  # with active checks off, it lets the block checks' gate open
        tasks.append(Task("health-active", lambda stop: _active(load, stop)))
    if role in ("controller", "worker") and spec.metrics:
        port = spec.metrics.port
        serve = lambda stop: _metrics(role, port, stop, spec_path, board)  # noqa: E731
        tasks.append(Task("metrics", serve))
    if role == "worker" and spec.health:
        tasks.append(Task("health-watch", _health_watch))
    if role in ("worker", "login") and (ports := spec.srun_ports):
        tasks.append(Task("srun-ports", lambda stop: _srun_ports(ports, stop)))
    return tasks


def _associations(load: Callable[[], ClusterSpec], stop: threading.Event) -> None:
    from slonk.accounting import sync

    sync.run_forever(load, stop)


def _users_sync(load: Callable[[], ClusterSpec], stop: threading.Event, pod: str) -> None:
    from slonk.users import sync

    sync.run_forever(load, stop, pod)


def _hooks(load: Callable[[], ClusterSpec], changes: Changes) -> Task:
    from slonk.hooks import revision

    root = changes.waiter(paths.GIT_ROOT, revision.POLL_SECONDS)
    return Task("hooks", lambda stop: revision.watch(load, stop, root))


def _recycle(load: Callable[[], ClusterSpec], stop: threading.Event) -> None:
    from slonk.align import recycle
    from slonk.kube.api import Api

    recycle.run_forever(load, Api, stop)


def _active(load: Callable[[], ClusterSpec], stop: threading.Event) -> None:
    from slonk.align import active

    active.run_forever(load, stop)


def _metrics(
    role: str, port: int, stop: threading.Event, spec_path: Path, board: Board | None
) -> None:
    from slonk.metrics import serve

    serve.serve(role, port, stop, spec_path, board=board)


def _srun_ports(ports: tuple[int, int], stop: threading.Event) -> None:
    from slonk.pod import srun_ports

    srun_ports.run_forever(ports, stop)


def _health_watch(stop: threading.Event) -> None:
    from slonk.health import watch

    watch.run(stop)


def first_spec(path: Path, waiter: Waiter, stop: threading.Event) -> ClusterSpec | None:
    """cluster.yaml as the agent starts; while it is not valid (an agent restarted after a
    bad ConfigMap), wait for the next change, saying why once. None: stopped meanwhile."""
    said = ""
    while not stop.is_set():
        try:
            return load_spec(path)
        except SpecError as err:
            if str(err) != said:
                log(f"waiting for a valid cluster.yaml: {err}")
            said = str(err)
        waiter.wait()
    return None


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM or SIGINT sets `stop`, from a thread of its own: a Python handler runs in the
    main thread between two of its steps, which may be inside stop.wait() holding the
    Event's lock, and set() there waits for that lock for ever (an agent ignored SIGTERM).
    The handler does nothing; the kernel's signal wakes the thread through the wakeup fd."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _ignore)

    def wait() -> None:
        os.read(read_end, 1)
        stop.set()

    threading.Thread(target=wait, name="signals", daemon=True).start()


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Handled, so that the signal neither kills the process nor is lost: see stop_on_signals."""


def run(role: str, spec_path: Path = paths.CLUSTER_SPEC) -> int:
    """Until SIGTERM (s6 stopping the pod or the service): exit 0 once the tasks ended."""
    sys.stdout, sys.stderr = LineWriter(1), LineWriter(2)
    stop = threading.Event()
    stop_on_signals(stop)
    changes = Changes(log)
    spec = first_spec(spec_path, changes.waiter(spec_path.parent, 1.0), stop)
    runner = None
    if spec is not None:
        pod = pod_name()
        board = Board()
        runner = Runner(
            tasks_for(spec, role, pod, changes, spec_path, board), stop, log, board=board
        )
        log(f"{role} {pod}: {', '.join(t.name for t in runner.tasks) or 'no tasks'}")
        runner.start()
        while not stop.wait(3600):
            pass
    changes.close()
    left = runner.join(STOP_SECONDS) if runner else []
    log("stopped" + (f"; left running: {', '.join(left)}" if left else ""))
    return 0
