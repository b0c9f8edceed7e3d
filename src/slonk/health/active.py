"""Active checks on this node: a probe that makes every GPU work (slonk.health.cuda on a real
node), its figures judged against the check's thresholds; or a site's own program, which
passes by exiting 0. They run in the `active` phase (a
Slurm job slonk.align.active submits to an idle node) and, with the gate, at `boot`, before
slurmd starts: a new pod's node enters service only once they pass.

A check's name in a node's plan, its results and its drain reason is `active:<check>`
(slonk.slurm.reasons): a HEALTH drain, the machine's, recycled and quarantined as any other."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slonk.config import check_names
from slonk.health.probe import Unhealthy, bounded

# Of a failing program's output, the drain reason keeps the last words (a diagnostic's verdict
# comes last), within what slonk.slurm.reasons keeps of a reason (250 characters) after its
# head, `slonk:active:<name>: ` and `<program> exited with <status>: ` (each bounded).
SAID = 120
PROGRAM = 40
# What a check that spans a block says at a new pod's boot, where it passes: the recycle is
# the repair, and the controller runs it again over the block once the node is in service.
BLOCK_AT_BOOT = "not run here: it spans a block, run by the controller over its idle nodes"


@dataclass(frozen=True)
class Figure:
    index: int
    name: str  # the GPU's model, as nvidia-smi names it
    value: float


def parse(output: str, unit: str) -> list[Figure]:
    """The probe's figures, one JSON line a GPU; anything else it printed is ignored (the
    driver's warnings). A line in the wrong shape or unit is the probe's fault: Unhealthy."""
    figures = []
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
            figure = Figure(int(record["index"]), str(record["name"]), float(record["value"]))
        except (ValueError, KeyError, TypeError) as err:
            raise Unhealthy(f"the probe printed {line[:80]!r}: {err}") from None
        if record.get("unit") != unit:
            raise Unhealthy(f"the probe measured in {record.get('unit')!r}, not {unit}")
        figures.append(figure)
    return figures


def judge(figures: list[Figure], options: Mapping[str, Any], unit: str) -> list[str]:
    """What fails: a GPU below its model's minimum, or more than spreadPercent below the
    node's best GPU (one slow board among eight, whatever its model)."""
    problems = []
    best = max(f.value for f in figures)
    spread = options["spreadPercent"]
    for f in figures:
        least = options["minimum"].get(f.name)
        if least is not None and f.value < least:
            problems.append(f"GPU {f.index} {f.value:g} {unit}, under {least:g} for {f.name}")
        elif spread and f.value < best * (100 - spread) / 100:
            problems.append(
                f"GPU {f.index} {f.value:g} {unit}, more than {spread}% under the best "
                f"here ({best:g})"
            )
    return problems


def check(options: Mapping[str, Any], gpus: int, timeout: float) -> str:
    """Run the check's probe and judge it: a short description, or Unhealthy with the figure
    that failed (the drain reason's detail)."""
    measure, unit = options["measure"], options["unit"]
    status, output = bounded([*shlex.split(options["probe"]), measure], timeout)
    said = " ".join(line for line in output.splitlines() if not line.startswith("{"))
    if status:
        raise Unhealthy(f"{measure} probe failed ({status}): {said[:160] or 'no output'}")
    figures = parse(output, unit)
    if not figures or len(figures) < gpus:
        raise Unhealthy(f"the {measure} probe measured {len(figures)} of {gpus} GPUs: {said[:120]}")
    problems = judge(figures, options, unit)
    if problems:
        raise Unhealthy("; ".join(problems))
    values = ", ".join(f"{f.value:g}" for f in figures)
    return f"{measure} {values} {unit}"


def run_command(options: Mapping[str, Any], timeout: float) -> str:
    """A site's own check: its program, which passes by exiting 0. A node without the program
    (not on PATH, or no such file) does not run it, and the check does not apply there: it
    passes, saying so, and a drain it made when the program was there is lifted. One that
    spans a block is run by the controller (slonk.align.fabric): here, at boot, it passes."""
    if options.get(check_names.SPAN) == check_names.BLOCK:
        return BLOCK_AT_BOOT
    argv = shlex.split(options["command"])
    program = os.path.basename(argv[0])[:PROGRAM]
    if shutil.which(argv[0]) is None:
        return f"not run: {program} is not on this node"
    status, output = bounded(argv, timeout)
    words = " ".join(output.split())
    if status:
        how = f"was killed by signal {-status}" if status < 0 else f"exited with {status}"
        raise Unhealthy(f"{program} {how}: {words[-SAID:] or 'no output'}")
    return f"{program} passed: {words[-SAID:]}" if words else f"{program} passed"
