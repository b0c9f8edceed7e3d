"""`slonk nodes`: the fleet at a glance, and `slonk nodes history [NODE]`: what happened to a
node or a machine, across its pods. Run in the controller pod, where scontrol and the node
history (slonk.health.history) are. Every value shown came from Slurm or the history file: each is
printed as one line of printable text."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Sequence

from slonk.base import paths
from slonk.base.text import printable
from slonk.health import history
from slonk.metrics import cause_label, node_events
from slonk.slurm import gate, slurm_nodes
from slonk.slurm.slurm_state import SlurmError


def shown(value: str, limit: int = 200) -> str:
    """One printable cell: a reason's line ends and escapes must not reach the terminal."""
    text = printable(value)
    return (text[: limit - 1] + "…") if len(text) > limit else text or "-"


def stamp(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def overview(
    events: Iterable[history.Event], window_seconds: float | None, now: float | None = None
) -> str:
    """One line per Slurm node: state, cause, since when (its last drain or resume in the
    history), recycles within the recycle window, the machine its pod runs on. A node the
    block checks' gate holds (slonk.slurm.gate), and nothing else keeps out, has the cause
    `gate`."""
    now = time.time() if now is None else now
    since: dict[str, float] = {}
    recycles: dict[str, int] = {}
    machine: dict[str, str] = {}
    for e in events:
        if e.event in ("drain", "resume"):
            since[e.node] = e.time
        if e.event == "recycle" and window_seconds is not None and now - e.time < window_seconds:
            recycles[e.node] = recycles.get(e.node, 0) + 1
        if e.machine:
            machine[e.node] = e.machine
    machine |= node_events.load_machines()
    try:
        held = gate.held()
    except SlurmError:
        held = set()
    rows = [["NODE", "STATE", "CAUSE", "SINCE", "RECYCLES", "MACHINE"]]
    for node in sorted(slurm_nodes.read_nodes(), key=lambda n: n.name):
        out = node_events.out_of_service(node)
        rows.append([
            shown(node.name),
            shown(node.label),
            cause_label(node.reason) if out else "gate" if node.name in held else "none",
            stamp(since[node.name]) if node.name in since else "-",
            "-" if window_seconds is None else str(recycles.get(node.name, 0)),
            shown(machine.get(node.name, "")),
        ])  # fmt: skip
    return table(rows)


def matches(e: history.Event, name: str) -> bool:
    return name in (e.node, e.machine) or name in e.gpus


def history_table(events: Iterable[history.Event], name: str | None) -> str:
    """Every event of the node, machine or GPU serial `name` (all with None), oldest first."""
    chosen = sorted((e for e in events if name is None or matches(e, name)), key=lambda e: e.time)
    rows = [["TIME (UTC)", "EVENT", "NODE", "MACHINE", "POD UID", "CAUSE", "GPUS", "REASON"]]
    rows += [
        [
            stamp(e.time),
            e.event,
            shown(e.node),
            shown(e.machine),
            shown(e.podUID[:8]),
            shown(e.cause),
            shown(",".join(e.gpus)),
            shown(e.reason, 400),
        ]
        for e in chosen
    ]
    return table(rows)


def main(command: str, name: str | None) -> int:
    from slonk.config.spec import load_spec

    read = history.load(paths.NODE_HISTORY)
    if command == "history":
        print(history_table(read.events, name))
    else:
        spec = load_spec(paths.CLUSTER_SPEC)
        recycle = spec.health.recycle if spec.health else None
        print(overview(read.events, recycle.window_seconds if recycle else None))
    if read.skipped:
        print(f"({read.skipped} line(s) of {paths.NODE_HISTORY} were no event: skipped)")
    return 0
