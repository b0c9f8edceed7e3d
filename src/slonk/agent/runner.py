"""The agent's tasks, each in its own thread, restarted with back-off when one fails.

A task that raises is restarted inside the agent, after 1 s, doubling to 60 s while it keeps
failing (back to 1 s once it ran a minute): a bug in one loop (a metrics source, an LDAP reply
nobody foresaw) must not stop the others, as exiting so that s6 restarts the whole agent
would: config-watch would miss changes while hooks and users start over, and a task failing
at every start would take every other task down with it each second. The traceback goes to
the pod's log once per failure. A task that returns has nothing left to do (its feature is
off) and is not started again.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
HEALTHY_AFTER_SECONDS = 60.0


@dataclass(frozen=True)
class Task:
    name: str
    # Runs until `stop` is set (then returns soon), or returns when it has nothing to do.
    run: Callable[[threading.Event], None]


class Runner:
    def __init__(
        self,
        tasks: list[Task],
        stop: threading.Event,
        log: Callable[[str], None],
        first_backoff: float = FIRST_BACKOFF_SECONDS,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tasks, self.stop, self.log, self.clock = tasks, stop, log, clock
        self.first_backoff, self.max_backoff = first_backoff, max_backoff
        self.threads: dict[str, threading.Thread] = {}
        self.failures: dict[str, int] = {}

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
            try:
                task.run(self.stop)
            except Exception:
                self.failures[task.name] = self.failures.get(task.name, 0) + 1
                self.log(f"task {task.name} failed:\n{traceback.format_exc().rstrip()}")
            else:
                return
            if self.clock() - started >= HEALTHY_AFTER_SECONDS:
                delay = self.first_backoff
            if self.stop.is_set():
                return
            self.log(f"task {task.name} starts again in {delay:g} s")
            if self.stop.wait(delay):
                return
            delay = min(delay * 2, self.max_backoff)

    def join(self, timeout: float) -> list[str]:
        """Wait up to `timeout` seconds in all for the tasks to end; the names still running."""
        deadline = self.clock() + timeout
        for thread in self.threads.values():
            thread.join(max(0.0, deadline - self.clock()))
        return [name for name, thread in self.threads.items() if thread.is_alive()]
