"""The active checks' Slurm jobs, as both schedules see them (slonk.align.active, each node's
own; slonk.align.fabric, a block's): where one may run, their states, and the one way a
queued one is withdrawn."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from slonk.base.files import write_atomically
from slonk.base.text import printable
from slonk.config import active_checks
from slonk.slurm import slurm_nodes
from slonk.slurm.slurm_state import NodeState, SlurmError

# A check job may wait this long in the queue. While users' jobs wait in a partition of a
# higher tier (on a busy cluster, always), Slurm's main scheduler passes over the checks'
# partition, and only its backfill scheduler starts a check, once per bf_interval (30 s by
# default; 25 s measured here). Past this it is withdrawn: its nodes were taken meanwhile.
QUEUED_SECONDS = 120.0
# The most of a program's last line a block run's drain reason carries.
WORDS = 160
# The states of a job still queued or running; any other state has ended.
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED"})
NOT_RUN = frozenset({"PREEMPTED", "CANCELLED", "BOOT_FAIL", "DEADLINE"})


def quiet(node: NodeState) -> bool:
    """Where a check may run: idle, answering, and nothing else (no drain, no power change,
    no reservation)."""
    return node.state == "idle" and not node.flags


def log(message: str) -> None:
    print(f"slonk health-active: {message}", file=sys.stderr, flush=True)


# A job that found its program missing on one of its nodes says so in its Comment (a job of
# the partition is root's alone: no user's job can say it) and ends COMPLETED; states() gives
# it this state of its own: not run, and not to be tried again before the interval.
NOT_HERE = "slonk-not-here"
# A block run whose program failed puts its last line in its Comment after this prefix (the
# program runs on the first node, where the controller cannot read its output).
SAID = "slonk-said: "


def states(said: dict[str, str] | None = None) -> dict[str, str]:
    """Every check job Slurm still shows, with its state (ended ones stay MinJobAge); into
    `said`, what each failed one said (SAID)."""
    out = slurm_nodes.run(
        [
            "squeue",
            "--noheader",
            "--all",
            "--states=all",
            f"--partition={active_checks.PARTITION}",
            "--format=%i %T %k",
        ],
        failed="squeue",
    )
    found = {}
    for line in out.splitlines():
        job, state, comment = [*line.split(maxsplit=2), "", ""][:3]
        if job and state:
            here = state != "COMPLETED" or comment.strip() != NOT_HERE
            found[job] = state if here else NOT_HERE
            if said is not None and state != "COMPLETED" and comment.startswith(SAID):
                said[job] = printable(comment.removeprefix(SAID).strip())[:WORDS]
    return found


def submit_argv(
    nodes: Sequence[str], gpus: int, minutes: int, name: str, wrap: str, *more: str
) -> list[str]:
    """sbatch for a check job: the whole of each node, by name, in the checks' partition, run
    from / (not the agent's directory, nor slurmstepd's /tmp if that is missing), its output
    dropped. (sbatch has no --immediate: one still queued after QUEUED_SECONDS is
    withdrawn, `settled_state`.)"""
    return [
        "sbatch",
        "--parsable",
        f"--partition={active_checks.PARTITION}",
        f"--nodelist={','.join(nodes)}",
        *more,
        "--exclusive",
        "--mem=0",
        *([f"--gres=gpu:{gpus}"] if gpus else []),
        f"--time={minutes}",
        f"--job-name={name}",
        "--chdir=/",
        "--output=/dev/null",
        f"--wrap={wrap}",
    ]


def settled_state(job: str, state: str, queued_at: float, now: float, idle: bool) -> str:
    """The job's state, one still queued withdrawn first once its nodes are no longer `idle`
    (taken, drained or lent meanwhile: started there later, it would hold up a user's job or
    call a lent machine back) or once it has waited QUEUED_SECONDS: a check waits for its
    nodes to be idle again, not in the queue."""
    if state != "PENDING" or (idle and now - queued_at < QUEUED_SECONDS):
        return state
    with contextlib.suppress(SlurmError):
        slurm_nodes.run(["scancel", job], failed=f"scancel {job}")
    return "CANCELLED"


@dataclass
class Saved:
    """A schedule kept as JSON in `path`, beside slurmctld's state: a controller restart or a
    takeover by the backup keeps its rounds. Lost or unreadable (said), it starts afresh: a
    round of checks comes sooner than due, none is skipped."""

    path: ClassVar[Path]

    @classmethod
    def parse(cls, data: Any) -> Self:
        raise NotImplementedError

    @classmethod
    def load(cls) -> Self:
        try:
            return cls.parse(json.loads(cls.path.read_text()))
        except FileNotFoundError:
            return cls()
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            log(f"{cls.path} unreadable, starting afresh: {err}")
            return cls()

    def save(self) -> None:
        try:
            write_atomically(self.path, json.dumps(asdict(self)) + "\n")
        except OSError as err:
            log(f"could not save {self.path}: {err}")
