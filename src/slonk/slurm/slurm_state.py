"""The one reader of Slurm's node and job state: `scontrol show node --json` and `squeue --json`
(Slurm 24.11, data_parser v0.0.42), never their text.

Text output put a person's reason, spaces, `Key=` and line ends and all, inside the line that
held the node's name and state; JSON keeps every value in its own field, so no reason can
forge another node's record or state. For nodes, `scontrol show node --json` rather than
`sinfo --json`: one record per node with its slurmd start time (sinfo has none, and repeats a
node per partition), in one call for all nodes.

Fails closed: output that is not JSON, reports errors, or lacks a field slonk reads is a
SlurmError naming what is missing, never an empty "nothing to do".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slonk.base.errors import SlonkError
from slonk.slurm import reasons

# One call for every node (or the named ones), one for the queue.
SHOW_NODES = ("scontrol", "show", "node", "--json")
QUEUE = ("squeue", "--json")
# Base states of a registered node that can run jobs; DOWN, UNKNOWN, FUTURE, ERROR cannot.
RUNNING_STATES = frozenset({"idle", "allocated", "mixed"})
# Power saving's flags (slonk.slurm.power lends a node's machine to Kubernetes as a powered-down
# node): asked to power down (POWER_DOWN, the node still runs), on its way (POWERING_DOWN,
# SuspendTimeout long), off (POWERED_DOWN); asked back (POWER_UP), waiting for its slurmd
# (POWERING_UP, up to ResumeTimeout). Slurm keeps the base state (IDLE) through all of them.
OFF_FLAGS = frozenset({"POWERING_DOWN", "POWERED_DOWN", "POWERING_UP"})


class SlurmError(SlonkError):
    pass


class SlurmNotInstalled(SlurmError):
    """A Slurm command this host or image does not have: asking again cannot help."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # Slurm's base state, lower case: idle, mixed, allocated, down, ...
    flags: frozenset[str]  # the rest of Slurm's state list: DRAIN, NOT_RESPONDING, ...
    reason: str
    slurmd_started: str = ""  # changes when a new slurmd registers ("0": never did)
    reason_by: str = ""  # the user who set the reason
    extra: str = ""  # Slurm's free-form Extra (slonk.health.serials writes GPU serials there)
    reason_time: int = 0  # when Slurm took the reason (seconds since the epoch; 0: unknown)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def up(self) -> bool:
        """Registered and answering the controller, whatever it runs, drained or not; not
        powered down or on its way up or down (Slurm keeps such a node IDLE)."""
        return (
            self.state in RUNNING_STATES
            and "NOT_RESPONDING" not in self.flags
            and not self.flags & OFF_FLAGS
        )

    @property
    def powered_down(self) -> bool:
        """Off in Slurm's eyes (`~` in sinfo): its slurmd is not expected to answer."""
        return "POWERED_DOWN" in self.flags

    @property
    def powering_down(self) -> bool:
        """Asked to power down, or on its way (`!`, `%` in sinfo)."""
        return bool(self.flags & {"POWER_DOWN", "POWERING_DOWN"})

    @property
    def powering_up(self) -> bool:
        """Asked back by Slurm (a job was given it, or POWER_UP): Slurm waits for its slurmd
        to register as newly booted, up to ResumeTimeout (`#` in sinfo)."""
        return bool(self.flags & {"POWER_UP", "POWERING_UP"})

    @property
    def schedulable(self) -> bool:
        """A job may start on it."""
        return self.up and not self.drained

    @property
    def label(self) -> str:
        """For people: `idle`, `idle+drain`, `unknown+not_responding`."""
        return "+".join([self.state, *sorted(flag.lower() for flag in self.flags)])

    @property
    def cause(self) -> reasons.Cause | None:
        """Why slonk drained the node (a check, a hook, quarantine), None when slonk did not
        drain it."""
        return reasons.classify(self.reason) if self.drained else None


@dataclass(frozen=True)
class Job:
    id: str
    state: str  # Slurm's base state: PENDING, RUNNING, COMPLETING, ...
    nodes: tuple[str, ...]  # the nodes it holds (none while pending)
    restarts: int = 0  # times it was requeued
    batch_host: str = ""  # where its batch step runs ("" while pending)


def _document(
    text: str, command: Sequence[str], key: str, hook: Callable[[dict[str, Any]], Any] | None = None
) -> list[Any]:
    where = " ".join(command)
    try:
        data = json.loads(text, object_hook=hook)
    except ValueError as err:
        raise SlurmError(f"{where}: output is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise SlurmError(f"{where}: output is not a JSON object")
    errors = data.get("errors")
    if errors:
        said = "; ".join(
            str(e.get("description") or e.get("error")) if isinstance(e, dict) else str(e)
            for e in (errors if isinstance(errors, list) else [errors])
        )
        raise SlurmError(f"{where}: Slurm reported errors: {said}")
    return _get(data, key, list, where)


def _get(record: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = record.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SlurmError(f"{where}: `{key}` is missing or not a {kind.__name__}")
    return value


def _number(record: Mapping[str, Any], key: str, where: str) -> int:
    """Slurm's {set, infinite, number} time stamps; 0 when not set."""
    value = _get(record, key, dict, where)
    return _get(value, "number", int, f"{where}: {key}") if value.get("set", True) else 0


def _optional_number(record: Mapping[str, Any], key: str) -> int:
    """A time stamp slonk can do without (0 when absent or not a number)."""
    value = record.get(key)
    number = value.get("number") if isinstance(value, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) else 0


def _state(record: Mapping[str, Any], key: str, where: str) -> tuple[str, frozenset[str]]:
    """Base state and flags from Slurm's state list, e.g. ["IDLE", "DRAIN"]."""
    state = _get(record, key, list, where)
    if not state or not all(isinstance(word, str) and word for word in state):
        raise SlurmError(f"{where}: `{key}` is not a list of states: {state!r:.200}")
    return state[0], frozenset(state[1:])


def _keeping(marker: str, fields: Collection[str] | None) -> Callable[[dict[str, Any]], Any] | None:
    """A JSON object hook that keeps only `fields` of each record (an object holding
    `marker`) as the parser makes it: the rest of a record is freed at once, so a reader of
    a few fields of 100,000 jobs holds those, not the whole document (a quarter of the
    memory in bench/metrics.py, and faster)."""
    if fields is None:
        return None
    kept = (marker, *fields)

    def hook(record: dict[str, Any]) -> dict[str, Any]:
        return {k: record[k] for k in kept if k in record} if marker in record else record

    return hook


def _records(items: list[Any], where: str) -> list[Mapping[str, Any]]:
    if not all(isinstance(item, dict) for item in items):
        raise SlurmError(f"{where}: a record is not a JSON object")
    return items


def node_records(text: str, fields: Collection[str] | None = None) -> list[Mapping[str, Any]]:
    """`scontrol show node --json`'s node records, each a JSON object (nothing else checked);
    only `fields` of each (and its name), if given."""
    hook = _keeping("name", fields)
    return _records(_document(text, SHOW_NODES, "nodes", hook), " ".join(SHOW_NODES))


def node_state(record: Mapping[str, Any]) -> NodeState:
    """One node record's state, or a SlurmError naming the node and the field it lacks."""
    command = " ".join(SHOW_NODES)
    name = _get(record, "name", str, f"{command}: a node")
    where = f"{command}: node {name!a}"
    state, flags = _state(record, "state", where)
    return NodeState(
        name=name,
        state=state.lower(),
        flags=flags,
        reason=_get(record, "reason", str, where),
        slurmd_started=str(_number(record, "slurmd_start_time", where)),
        reason_by=_get(record, "reason_set_by_user", str, where),
        extra=record["extra"] if isinstance(record.get("extra"), str) else "",
        reason_time=_optional_number(record, "reason_changed_at"),
    )


def parse_nodes(text: str) -> list[NodeState]:
    """`scontrol show node --json`'s nodes."""
    return [node_state(record) for record in node_records(text)]


def job_nodes(record: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The nodes the job was given: job_resources' allocation (null while pending)."""
    resources = record.get("job_resources")
    if resources is None:
        return ()
    if not isinstance(resources, dict):
        raise SlurmError(f"{where}: `job_resources` is not an object")
    allocation = _get(_get(resources, "nodes", dict, where), "allocation", list, where)
    return tuple(_get(node, "name", str, f"{where}: allocation")
                 for node in _records(allocation, where))  # fmt: skip


def _allocated_names(resources: Any) -> Any:
    """A job's `job_resources` as job_nodes reads it, its nodes' names alone: each node's
    sockets and cores, most of a running job's record, are freed as they are parsed. Any
    other shape is kept, for job_nodes to refuse."""
    nodes = resources.get("nodes") if isinstance(resources, dict) else None
    allocation = nodes.get("allocation") if isinstance(nodes, dict) else None
    if not isinstance(allocation, list) or not all(isinstance(n, dict) for n in allocation):
        return resources
    return {"nodes": {"allocation": [{"name": n.get("name")} for n in allocation]}}


def _job_hook(fields: Collection[str] | None) -> Callable[[dict[str, Any]], Any] | None:
    """_keeping's hook for job records, `job_resources` trimmed to what job_nodes reads."""
    keep = _keeping("job_id", fields)
    if keep is None or fields is None or "job_resources" not in fields:
        return keep

    def hook(record: dict[str, Any]) -> Any:
        kept = keep(record)
        if "job_id" in kept and "job_resources" in kept:
            kept["job_resources"] = _allocated_names(kept["job_resources"])
        return kept

    return hook


def job_records(text: str, fields: Collection[str] | None = None) -> list[Mapping[str, Any]]:
    """`squeue --json`'s job records (or `scontrol show job --json`'s: the same records);
    only `fields` of each (and its id), if given, `job_resources` among them only as far as
    job_nodes reads it."""
    hook = _job_hook(fields)
    return _records(_document(text, QUEUE, "jobs", hook), " ".join(QUEUE))


def job_state(record: Mapping[str, Any]) -> tuple[str, str]:
    """A job record's id and base state (PENDING, RUNNING, ...), or a SlurmError."""
    command = " ".join(QUEUE)
    job_id = _get(record, "job_id", int, f"{command}: a job")
    state, _ = _state(record, "job_state", f"{command}: job {job_id}")
    return str(job_id), state


def parse_jobs(text: str) -> list[Job]:
    """`squeue --json`'s jobs (or `scontrol show job --json`'s: the same records)."""
    jobs, command = [], " ".join(QUEUE)
    for record in job_records(text):
        job_id, state = job_state(record)
        where = f"{command}: job {job_id}"
        jobs.append(Job(
            id=job_id,
            state=state,
            nodes=job_nodes(record, where),
            restarts=_get(record, "restart_cnt", int, where),
            batch_host=_get(record, "batch_host", str, where),
        ))  # fmt: skip
    return jobs
