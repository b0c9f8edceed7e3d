"""Whole log lines from many threads: each line reaches the pod's log in one write.

The agent's tasks print to stdout and stderr, which s6 joins into one pipe. Python's print
writes a message and its newline separately, so two threads could make one line of two, and
`slonk local upgrade` reads config-watch's verdict line by line. A line (under PIPE_BUF, 4096
bytes) written in one write() is never split on a pipe.
"""

from __future__ import annotations

import io
import os
import threading


class LineWriter(io.TextIOBase):
    """A text stream that writes complete lines to `fd`, each in one write; the rest of a
    line waits, per thread, for its newline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.local = threading.local()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        pending = getattr(self.local, "pending", "") + text
        head, newline, rest = pending.rpartition("\n")
        if newline:
            data = (head + newline).encode(errors="replace")
            while data:
                data = data[os.write(self.fd, data) :]
        self.local.pending = rest
        return len(text)

    def fileno(self) -> int:
        return self.fd
