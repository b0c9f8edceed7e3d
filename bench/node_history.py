"""The node history (slonk.health.history), measured on this machine's disk. Prints one JSON
document.

- one append (a whole line under the file's lock), the syncer's and recycle loop's cost per
  event, timed over APPENDS appends to a file near its bound;
- reading a history at its bound (MAX_BYTES, what `slonk nodes` and the exporter's first
  scrape read), and following it (an exporter scrape with nothing new, then with one line);
- one compaction (the append that crosses the bound), and the file size after it.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from slonk.health import history

APPENDS = 2000
REASON = "slonk:gpu: GPU 1 (00000000:2A:00.0): 2 uncorrectable ECC errors; XID 79 on PCI:0000:2a"


def event(n: int) -> history.Event:
    return history.Event(
        time=1.8e9 + n,
        event=("drain", "resume", "recycle", "quarantine")[n % 4],
        node=f"slonk-h100-{n % 15000}",
        machine=f"gpu-node-{n % 15000:05d}.example.org",
        gpus=tuple(f"16540000{n % 15000:05d}{i}" for i in range(8)),
        pod=f"slonk-h100-{n % 15000}",
        podUID=f"6f1c2d4e-0b7a-4c1e-9f3a-{n:012d}",
        cause="gpu",
        reason=REASON,
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        line = len(event(14999).line())  # the longest: five-digit node numbers
        lines, size, n = [], 0, 0
        while size + line < history.MAX_BYTES - (APPENDS + 2) * line:  # the timed appends fit
            lines.append(event(n).line())
            size, n = size + len(lines[-1]), n + 1
        path.write_bytes(b"".join(lines))
        below = n
        times = []
        for n in range(below, below + APPENDS):
            started = time.perf_counter()
            history.append([event(n)], path)
            times.append(time.perf_counter() - started)
        started = time.perf_counter()
        read = history.load(path)
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        _, offset = history.follow(path, read.offset)
        follow_idle_s = time.perf_counter() - started
        history.append([event(0)], path)
        started = time.perf_counter()
        new, offset = history.follow(path, offset)
        follow_one_s = time.perf_counter() - started
        size_before = path.stat().st_size
        while path.stat().st_size >= size_before:  # the append that crosses the bound
            started = time.perf_counter()
            history.append([event(1)], path)
            compact_s = time.perf_counter() - started
        print(json.dumps({
            "line_bytes": line,
            "append_ms_median": round(statistics.median(times) * 1000, 3),
            "append_ms_p99": round(sorted(times)[int(len(times) * 0.99)] * 1000, 3),
            "history_bytes": size_before,
            "history_events": len(read.events),
            "read_all_s": round(read_s, 3),
            "follow_nothing_new_ms": round(follow_idle_s * 1000, 3),
            "follow_one_new_ms": round(follow_one_s * 1000, 3),
            "followed_events": len(new),
            "compacting_append_s": round(compact_s, 3),
            "bytes_after_compaction": path.stat().st_size,
        }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
