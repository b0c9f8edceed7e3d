"""Waiting for a directory to change: on inotify when the kernel gives the agent an
instance, by polling otherwise.

One inotify instance serves the whole agent (instances are counted per user, and every local
pod runs as the host's root: fs.inotify.max_user_instances, 128 by default, is soon used up),
read by one thread that wakes the waiters of the directories that changed. Without an
instance, or for a directory that cannot be watched (yet), a waiter polls at the interval its
task polled at before inotify; the agent says so once.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from pathlib import Path

from slonk.agent.inotify import IN_IGNORED, IN_Q_OVERFLOW, Inotify

# Without an event, a waiter's task looks anyway this often: an event the kernel dropped, a
# mount inotify does not see.
RECHECK_SECONDS = 60.0


class Waiter:
    """Wakes its task when an entry of `directory` may have changed. The task waits, then
    looks at what it follows: a change after the wait returned wakes the next wait."""

    def __init__(self, changes: Changes, directory: Path, poll_seconds: float) -> None:
        self.changes, self.directory, self.poll_seconds = changes, directory, poll_seconds
        self.event = threading.Event()
        self.wd: int | None = None

    @property
    def watched(self) -> bool:
        return self.wd is not None

    def describe(self) -> str:
        """How it waits, for the task's first log line (it tries to watch first)."""
        self.changes.add(self)
        if self.watched:
            return f"{self.directory} (inotify)"
        return f"{self.directory} every {self.poll_seconds:g} s"

    def wait(self, timeout: float = RECHECK_SECONDS) -> None:
        """Until a change, `timeout` seconds, or the agent stops (Changes.close)."""
        if not self.watched and self.changes.add(self):  # the directory may exist by now
            return  # it may have changed before the watch began: look once more
        if not self.watched:
            timeout = min(timeout, self.poll_seconds)
        self.event.wait(max(0.0, timeout))
        self.event.clear()


class Changes:
    def __init__(self, log: Callable[[str], None], make: Callable[[], Inotify] = Inotify) -> None:
        self.log = log
        self.waiters: dict[int, list[Waiter]] = {}
        self.all: list[Waiter] = []
        self.lock = threading.Lock()
        self.closed = False
        self.inotify: Inotify | None = None
        try:
            self.inotify = make()
        except OSError as err:
            log(f"inotify unavailable ({err}); polling instead (fs.inotify.max_user_instances)")
            return
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self.reader = threading.Thread(target=self._read, name="inotify", daemon=True)
        self.reader.start()

    def waiter(self, directory: Path, poll_seconds: float) -> Waiter:
        waiter = Waiter(self, directory, poll_seconds)
        with self.lock:
            self.all.append(waiter)
        return waiter

    def add(self, waiter: Waiter) -> bool:
        """Watch the waiter's directory; True if it is watched from now on."""
        with self.lock:
            if self.inotify is None or waiter.wd is not None or self.closed:
                return False
            try:
                wd = self.inotify.add_watch(waiter.directory)
            except OSError:
                return False  # not there (yet), or watches used up: the waiter polls
            waiter.wd = wd
            self.waiters.setdefault(wd, []).append(waiter)
            return True

    def _read(self) -> None:
        assert self.inotify is not None
        while True:
            ready, _, _ = select.select([self.inotify.fd, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            woken: set[Waiter] = set()
            with self.lock:
                for event in self.inotify.read():
                    if event.mask & IN_Q_OVERFLOW:  # events were lost: everyone looks
                        woken.update(self.all)
                        continue
                    found = self.waiters.get(event.wd, [])
                    woken.update(found)
                    if event.mask & IN_IGNORED:  # the directory went: watch it again
                        for waiter in self.waiters.pop(event.wd, []):
                            waiter.wd = None
            for waiter in woken:
                waiter.event.set()

    def close(self) -> None:
        """Wake every waiter (its task sees the agent stopping) and end the reader."""
        with self.lock:
            self.closed = True
            waiters = list(self.all)
        for waiter in waiters:
            waiter.event.set()
        if self.inotify is not None:
            os.write(self._wake_w, b"x")
            self.reader.join()
            self.inotify.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self.inotify = None
