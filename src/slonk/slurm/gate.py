"""The gate of the checks that span a block (slonk.align.fabric). A node coming back (its pod
recycled or quarantined, or its slurmd gone: a new pod, a lost one) is held out of users' reach
in one Slurm reservation until a run of those checks over it passes.

A reservation, not a drain: a drained node could not run the check that lets it out. It is
root's alone, so no user's job lands on a held node, and FLEX, so a check's run over a held
node may take nodes outside it too (its partners, still in service: any user's job preempts
the run there). The reservation lives in slurmctld's state, so a restarted controller, or the
backup taking over, holds the same nodes; when none is held it is deleted. Two loops change it
(the recycle loop holds, the checks' pass holds and lets out): each change reads it afresh
under one lock, so neither undoes the other's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import hostlist

from slonk.base import paths
from slonk.base.files import exclusive
from slonk.slurm import slurm_nodes
from slonk.slurm.slurm_state import SlurmError

NAME = "slonk-gate"
LOCK = paths.STATE_SAVE / "slonk-gate.lock"
# OVERLAP: a site's own reservation on a node (maintenance) does not keep it out of the gate.
# IGNORE_JOBS: a node Slurm still counts a job on (its slurmd gone) is held too.
FLAGS = "FLEX,OVERLAP,IGNORE_JOBS"
# Slurm ends an "infinite" reservation a year after its start, and would let every node it
# holds out unchecked: one that ends within this is given another year (keep_open).
RENEW_SECONDS = 30 * 86400


def read() -> tuple[set[str], float]:
    """The nodes the gate holds now (none when there is no reservation), and when Slurm would
    end it (0 without one)."""
    out = slurm_nodes.scontrol("show", "reservation", NAME, "--json")
    nodes: set[str] = set()
    ends = 0.0
    try:
        for record in json.loads(out).get("reservations") or []:
            if isinstance(record, dict) and record.get("name") == NAME:
                nodes |= set(hostlist.expand_hostlist(str(record.get("node_list") or "")))
                ends = float((record.get("end_time") or {}).get("number") or 0)
    except (ValueError, TypeError, AttributeError, hostlist.BadHostlist) as err:
        raise SlurmError(f"scontrol show reservation {NAME}: {err}") from None
    return nodes, ends


def held() -> set[str]:
    return read()[0]


def keep_open(ends: float, now: float) -> None:
    """Give a reservation that ends within RENEW_SECONDS another year."""
    if 0 < ends - now < RENEW_SECONDS:
        slurm_nodes.scontrol("update", f"ReservationName={NAME}", "EndTime=now+365days")


def hold(nodes: Iterable[str]) -> set[str]:
    """Hold these nodes too; returns the nodes held after it."""
    with exclusive(LOCK):
        before = held()
        more = sorted(set(nodes) - before)
        if not more:
            return before
        listed = hostlist.collect_hostlist(more)
        if before:
            slurm_nodes.scontrol("update", f"ReservationName={NAME}", f"Nodes+={listed}")
        else:
            slurm_nodes.scontrol(
                "create",
                "reservation",
                f"ReservationName={NAME}",
                f"Nodes={listed}",
                "StartTime=now",
                "Duration=infinite",
                "Users=root",
                f"Flags={FLAGS}",
            )
        return before | set(more)


def release(nodes: Iterable[str]) -> set[str]:
    """Let these nodes out; returns the nodes still held. The last one out deletes the
    reservation (Slurm keeps none without nodes)."""
    with exclusive(LOCK):
        before = held()
        out = sorted(set(nodes) & before)
        if not out:
            return before
        left = before - set(out)
        if left:
            listed = hostlist.collect_hostlist(out)
            slurm_nodes.scontrol("update", f"ReservationName={NAME}", f"Nodes-={listed}")
        else:
            slurm_nodes.scontrol("delete", f"ReservationName={NAME}")
        return left
