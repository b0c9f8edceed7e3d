"""The GPU check: what nvidia-smi and the kernel log say about a node's GPUs."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from slonk.health.probe import Unhealthy, bounded

FIELDS = (
    "index",
    "pci.bus_id",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "memory.used",
)
APP_FIELDS = ("pid", "process_name", "used_memory")
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
XID_LINE = re.compile(r"NVRM: Xid \((?P<device>[^)]*)\): (?P<xid>\d+),")


def expected_count(options: Mapping[str, Any], pool_gpus: int) -> int:
    """GPUs every node must show: the option, else (0) the pool's GRES count."""
    return int(options["expectedCount"] or pool_gpus)


def query(command: str, fields: tuple[str, ...], kind: str, timeout: float) -> list[list[str]]:
    """Rows of an nvidia-smi CSV query. A GPU nvidia-smi cannot reach is reported in
    prose ("Unable to determine the device handle for GPU ...: GPU is lost") among the rows."""
    argv = [
        *shlex.split(command),
        f"--query-{kind}={','.join(fields)}",
        "--format=csv,noheader,nounits",
    ]
    status, output = bounded(argv, timeout)
    rows, prose = [], []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(fields):
            rows.append(cells)
        elif line.strip():
            prose.append(line.strip())
    if prose or status:
        raise Unhealthy(prose[0] if prose else f"nvidia-smi exited with {status}")
    return rows


def _number(cell: str) -> int:
    """Counters read `[N/A]` where a GPU does not track them (ECC off, no page retirement)."""
    return int(cell) if cell.isdigit() else 0


def gpu_problems(rows: list[list[str]], expected: int, max_used_mib: int | None) -> list[str]:
    problems = []
    if len(rows) != expected:
        problems.append(f"{len(rows)} of {expected} GPUs visible")
    for index, bus, ecc, retired, remap_pending, remap_failed, used in rows:
        name = f"GPU {index} ({bus})"
        if _number(ecc):
            problems.append(f"{name}: {ecc} uncorrectable ECC errors")
        if retired == "Yes":
            problems.append(f"{name}: page retirement pending")
        if remap_pending == "Yes":
            problems.append(f"{name}: row remap pending, needs a reset")
        if remap_failed == "Yes":
            problems.append(f"{name}: row remap failed")
        if max_used_mib is not None and _number(used) > max_used_mib:
            problems.append(f"{name}: {used} MiB still in use")
    return problems


def xids(command: str, critical: set[int], timeout: float) -> list[str]:
    status, output = bounded(shlex.split(command), timeout)
    if status:
        first = output.strip().splitlines()[:1] or [f"exit {status}"]
        raise Unhealthy(f"cannot read the kernel log for XIDs: {first[0]}")
    seen: dict[tuple[str, int], int] = {}
    for match in XID_LINE.finditer(output):
        key = (match["device"], int(match["xid"]))
        if key[1] in critical:
            seen[key] = seen.get(key, 0) + 1
    return [f"XID {xid} on {device} (x{n})" for (device, xid), n in sorted(seen.items())]


def smi_problems(
    options: Mapping[str, Any], expected: int, free: bool, timeout: float
) -> tuple[int, list[str]]:
    """How many GPUs nvidia-smi shows, and what is wrong with them; `free` (no job on them),
    they must also hold no process and no memory."""
    rows = query(options["nvidiaSmi"], FIELDS, "gpu", timeout)
    problems = gpu_problems(rows, expected, options["maxUsedMemoryMiB"] if free else None)
    if free:
        for pid, process, used in query(options["nvidiaSmi"], APP_FIELDS, "compute-apps", timeout):
            problems.append(f"process {pid} ({process}) left on a GPU with {used} MiB")
    return len(rows), problems


def check(options: Mapping[str, Any], expected: int, free: bool, timeout: float) -> str:
    """The GPUs' health; with `free` (no job on them), also that nothing is left on them."""
    count, problems = smi_problems(options, expected, free, timeout)
    if options["dmesg"]:
        problems += xids(options["dmesg"], set(options["xids"]), timeout)
    if problems:
        raise Unhealthy("; ".join(problems))
    return f"{count} GPUs healthy"
