"""The agent's tasks, each in its own thread, restarted with back-off when one fails.

A task that raises is restarted inside the agent, after 1 s, doubling to 60 s while it keeps
failing (back to 1 s once it ran a minute): a bug in one loop (a metrics source, an LDAP reply
nobody foresaw) must not stop the others, as exiting so that s6 restarts the whole agent
would: config-watch would miss changes while hooks and users start over, and a task failing
at every start would take every other task down with it each second.

A failure is never silent: it is one line in the pod's log (the task, the error, where it was
raised, when the task starts again), and the Board counts it for the metrics task
(slonk.metrics.tasks: failures, whether each task runs, when it started and last failed). A
task that returns has nothing left to do (its feature is off) and is not started again.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slonk.base.text import printable

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
HEALTHY_AFTER_SECONDS = 60.0
MAX_ERROR_CHARS = 500  # of the error's text in the log line (an LDAP reply can be long)
FRAMES = 3  # where it was raised: the innermost frames


@dataclass(frozen=True)
class Task:
    name: str
    # Runs until `stop` is set (then returns soon), or returns when it has nothing to do.
    run: Callable[[threading.Event], None]


@dataclass(frozen=True)
class TaskState:
    running: bool = False
    failures: int = 0
    started: float = 0.0  # seconds since the epoch of the latest start; 0: never
    failed: float = 0.0  # ... of the latest failure; 0: never


class Board:
    """Each task's state as its supervisor last set it; read by the metrics task's thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: dict[str, TaskState] = {}

    def set(self, name: str, **changes: Any) -> TaskState:
        with self.lock:
            state = self.states[name] = replace(self.states.get(name, TaskState()), **changes)
            return state

    def failed(self, name: str) -> TaskState:
        with self.lock:
            state = self.states.get(name, TaskState())
            state = replace(state, running=False, failures=state.failures + 1, failed=time.time())
            self.states[name] = state
            return state

    def snapshot(self) -> dict[str, TaskState]:
        with self.lock:
            return dict(self.states)


def one_line(err: BaseException) -> str:
    """The error and where it was raised, on one line: `Type: text (at file:line in func <
    ...)`, innermost first."""
    said = " ".join(f"{type(err).__name__}: {err}".split())[:MAX_ERROR_CHARS]
    text = printable(said)
    frames = traceback.extract_tb(err.__traceback__)[1:][-FRAMES:]  # not the runner's own
    where = " < ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))
    return f"{text} (at {where})" if where else text


class Runner:
    def __init__(
        self,
        tasks: list[Task],
        stop: threading.Event,
        log: Callable[[str], None],
        first_backoff: float = FIRST_BACKOFF_SECONDS,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        board: Board | None = None,
    ) -> None:
        self.tasks, self.stop, self.log, self.clock = tasks, stop, log, clock
        self.first_backoff, self.max_backoff = first_backoff, max_backoff
        self.board = board or Board()
        self.threads: dict[str, threading.Thread] = {}
        for task in tasks:
            self.board.set(task.name)  # shown from 0 before it first runs

    @property
    def failures(self) -> dict[str, int]:
        return {n: s.failures for n, s in self.board.snapshot().items() if s.failures}

    def start(self) -> None:
        for task in self.tasks:
            # Daemon threads: one stuck in a slow call (an LDAP search, scontrol) cannot hold
            # the agent past its stop.
            thread = threading.Thread(target=self._supervise, args=(task,), name=task.name)
            thread.daemon = True
            self.threads[task.name] = thread
            thread.start()

    def _supervise(self, task: Task) -> None:
        delay = self.first_backoff
        while not self.stop.is_set():
            started = self.clock()
            self.board.set(task.name, running=True, started=time.time())
            try:
                task.run(self.stop)
            except BaseException as err:  # SystemExit too: a task's thread never ends unseen
                state = self.board.failed(task.name)
                if self.clock() - started >= HEALTHY_AFTER_SECONDS:
                    delay = self.first_backoff
                again = "" if self.stop.is_set() else f"; starts again in {delay:g} s"
                self.log(
                    f"task {task.name} failed ({state.failures} so far): {one_line(err)}{again}"
                )
            else:
                self.board.set(task.name, running=False)
                if not self.stop.is_set():
                    self.log(f"task {task.name} ended: nothing left to do")
                return
            if self.stop.wait(delay):
                return
            delay = min(delay * 2, self.max_backoff)

    def join(self, timeout: float) -> list[str]:
        """Wait up to `timeout` seconds in all for the tasks to end; the names still running."""
        deadline = self.clock() + timeout
        for thread in self.threads.values():
            thread.join(max(0.0, deadline - self.clock()))
        return [name for name, thread in self.threads.items() if thread.is_alive()]
