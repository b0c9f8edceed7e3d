"""The durable history of every node's drains, resumes, recycles and quarantines, on the
controller's volume (paths.NODE_HISTORY), keyed by the machine: the Kubernetes Node the pod
ran on and its GPUs' serial numbers. A machine that comes back under a new pod shows its past.

One JSON object a line. Writers (the syncer, the recycle loop: separate processes) append a
whole line in one write under an fcntl lock on the file. Past MAX_BYTES the file is compacted:
rewritten atomically with its newest lines, after a first line `{"base": N}` saying how many
bytes of the history came before them. Offsets handed to followers count from the start of the
history, not of the file, so a follower resumes where it was across a compaction and never
reads a line twice.

Lines are read as untrusted: one that is not JSON, or not an event, is skipped and counted;
the others are kept. Every field is bounded when written.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from slonk.base import paths
from slonk.base.files import write_atomically

EVENTS = ("drain", "resume", "recycle", "quarantine")
MAX_BYTES = 8 * 1024 * 1024  # compacted beyond this...
KEEP_BYTES = MAX_BYTES // 2  # ...to the newest lines that fit in this
MAX_TEXT = 1024  # a reason as Slurm shows it is shorter; a person's may be anything
MAX_NAME = 253  # a Kubernetes Node name's limit
MAX_GPUS = 64
MAX_TIME = 2.0**33  # seconds since 1970: the year 2242
MAX_HEADER = 100  # the compaction header's line is shorter


def _text(value: str, limit: int) -> str:
    return value[:limit]


@dataclass(frozen=True)
class Event:
    time: float
    event: str  # one of EVENTS
    node: str  # the Slurm node (the pod's name)
    machine: str = ""  # the Kubernetes Node the pod ran on ("" when unknown)
    gpus: tuple[str, ...] = ()  # the GPUs' serial numbers, where nvidia-smi gives them
    pod: str = ""
    podUID: str = ""  # the contract's JSON name
    cause: str = "none"  # slonk.metrics.cause_label of the reason
    reason: str = ""  # the Slurm reason, as written

    def bounded(self) -> Event:
        return Event(
            time=float(self.time),
            event=self.event,
            node=_text(self.node, MAX_NAME),
            machine=_text(self.machine, MAX_NAME),
            gpus=tuple(_text(g, 64) for g in self.gpus[:MAX_GPUS]),
            pod=_text(self.pod, MAX_NAME),
            podUID=_text(self.podUID, 64),
            cause=_text(self.cause, 64),
            reason=_text(self.reason, MAX_TEXT),
        )

    def line(self) -> bytes:
        record = asdict(self.bounded())
        record["gpus"] = list(record["gpus"])
        # ensure_ascii: a reason's line ends and controls are escapes, never a new line
        return (json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


_STRINGS = ("node", "machine", "pod", "podUID", "cause", "reason")


def parse(line: bytes) -> Event | None:
    """One line's event; None when it is not one (corrupt, hostile, or cut short)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("event") not in EVENTS:
        return None
    stamp, gpus = record.get("time"), record.get("gpus", [])
    if not isinstance(stamp, int | float) or isinstance(stamp, bool) or not 0 <= stamp < MAX_TIME:
        return None  # NaN and infinities fail the range too: every time prints as a date
    if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
        return None
    values = {key: record.get(key, "") for key in _STRINGS}
    if not all(isinstance(v, str) for v in values.values()):
        return None
    return Event(time=float(stamp), event=record["event"], gpus=tuple(gpus), **values).bounded()


def _base(first: bytes) -> int | None:
    """The compaction header's base, or None when `first` is no header."""
    try:
        record = json.loads(first)
    except ValueError:
        return None
    if isinstance(record, dict) and set(record) == {"base"} and isinstance(record["base"], int):
        return max(0, record["base"])
    return None


@dataclass
class Read:
    events: list[Event] = field(default_factory=list)
    skipped: int = 0  # lines that were no event
    offset: int = 0  # where the history's complete lines end (for follow)


def _scan(data: bytes, start: int, base: int, header: int) -> Read:
    """The complete lines of `data`, the file's bytes from physical `start`; offsets logical
    (base + bytes past the header)."""
    result = Read(offset=base + start - header)
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        event = parse(line)
        if event is None:
            result.skipped += 1
        else:
            result.events.append(event)
    result.offset += end
    return result


def _header(first: bytes) -> tuple[int, int]:
    """(base, header length) from a file's first line (with its line end)."""
    base = _base(first) if first.startswith(b"{") and first.endswith(b"\n") else None
    return (0, 0) if base is None else (base, len(first))


def load(path: Path = paths.NODE_HISTORY, offset: int = 0) -> Read:
    """Every event past logical `offset` (0: all), with the count of lines skipped. A missing
    file is an empty history. When compaction dropped the lines at `offset`, reading starts
    at the oldest line kept: what was dropped unread is gone, nothing is read twice. Only
    the bytes past `offset` are read."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return Read(offset=offset)
    with handle:
        base, header = _header(handle.readline(MAX_HEADER))
        start = header + max(0, offset - base)
        if start > os.fstat(handle.fileno()).st_size:  # past the end: another file's offset
            start = header
        handle.seek(start)
        return _scan(handle.read(), start, base, header)


def read(path: Path = paths.NODE_HISTORY) -> list[Event]:
    return load(path).events


def end(path: Path = paths.NODE_HISTORY) -> int:
    """The logical offset of the history's end: where a follower of new events only starts."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return 0
    with handle:
        base, header = _header(handle.readline(MAX_HEADER))
        return base + os.fstat(handle.fileno()).st_size - header


def follow(path: Path, offset: int) -> tuple[list[Event], int]:
    """The complete lines appended since `offset`, and the offset to pass next time."""
    result = load(path, offset)
    return result.events, result.offset


@contextmanager
def _locked(path: Path) -> Iterator[IO[bytes]]:
    """The history file open for appending, under its lock: the file the path names once the
    lock is held (a compaction may have replaced the one opened while waiting)."""
    while True:
        handle = open(path, "a+b")  # noqa: SIM115 (closed below, or kept for the caller)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            if os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    try:
        yield handle
    finally:
        handle.close()  # releases the lock


def append(events: Iterable[Event], path: Path = paths.NODE_HISTORY) -> None:
    """Add events, each one line written whole; compact when the file outgrew MAX_BYTES.
    Raises OSError when the volume refuses (the caller logs it: the change stands)."""
    data = b"".join(e.line() for e in events)
    if not data:
        return
    with _locked(path) as handle:
        fd = handle.fileno()  # written unbuffered: what failed is known, and undone
        size = os.lseek(fd, 0, os.SEEK_END)
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a writer killed mid-line: that line alone is lost
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
        except OSError:
            # A volume that filled mid-line: the line cut short goes, or the next one
            # appended after it would be glued to it and both lost as one corrupt line.
            # Whole lines stay: a follower may have read them already.
            os.ftruncate(fd, size + data.rfind(b"\n", 0, written) + 1)
            raise
        if size + len(data) > MAX_BYTES:
            _compact(path)


def _compact(path: Path) -> None:
    """Rewrite the file (its lock held) with its newest complete lines within KEEP_BYTES."""
    keep = KEEP_BYTES
    data = path.read_bytes()
    base, header = _header(data[: data.find(b"\n") + 1])
    end = data.rfind(b"\n") + 1
    cut = max(header, end - keep)
    if cut > header and data[cut - 1 : cut] != b"\n":  # mid-line: from the next whole one
        cut = data.index(b"\n", cut) + 1
    new_base = base + cut - header
    kept = data[cut:end]
    write_atomically(path, json.dumps({"base": new_base}).encode() + b"\n" + kept, mode=0o644)


def record(
    events: Sequence[Event], log: Callable[[str], None], path: Path = paths.NODE_HISTORY
) -> None:
    """append(), a failure said through `log` rather than raised: a history that cannot be
    written must not stop a drain, a recycle or a pass."""
    try:
        append(events, path)
    except OSError as err:
        log(f"could not record {len(events)} node event(s) in {path}: {err}")
