"""Lending a node's machine to Kubernetes and giving it back, in Slurm's words: power saving.

A pool's size in Slurm is the chart's `nodepools.<pool>.replicas` (every node is in
slurm.conf); its StatefulSet may run fewer pods, the highest ordinals being lent (to
inference). Slurm shows a lent node powered down (`~` in sinfo), never DOWN, and a job that
needs it pends, saying why. The syncer (slonk.align) sees which ordinals are lent and calls
`lend` and `give_back`; slurmctld's ResumeProgram calls `record_resume`.

Measured on Slurm 24.11.5 (slurm.conf: slonk.config.render's POWER_SAVE):
- `state=POWER_DOWN` on an idle node: a power-save pass (power_save_interval) makes it
  POWERING_DOWN and clears its DRAIN (keeping the reason), runs SuspendProgram, and after
  SuspendTimeout it is IDLE+POWERED_DOWN. A DRAIN set again while POWERING_DOWN stays:
  IDLE+DRAIN+POWERED_DOWN, `drained~`. Jobs needing it pend with "Nodes required for job are
  DOWN, DRAINED or reserved for jobs in higher priority partitions".
- Without that drain (capacity.returnOnDemand), the scheduler gives a job the powered-down
  node: the job is CONFIGURING, the node POWERING_UP, and slurmctld runs ResumeProgram with
  the node's name. If no slurmd registers within ResumeTimeout, the node becomes
  DOWN+POWERED_DOWN ("ResumeTimeout reached"): a requeueable batch job is requeued, a
  --no-requeue job ends NODE_FAIL.
- A slurmd registering while its node is POWERED_DOWN powers it up (IDLE, or IDLE+DRAIN);
  while POWERING_DOWN, it is ignored (the node then stays POWERED_DOWN under a running
  slurmd); while POWERING_UP, only a slurmd that says it booted after the resume request is
  taken ("Still waiting for boot of node" otherwise): a pod shares the host's uptime, so
  `slurmd_flags` starts such a node's slurmd with -b (and waits out POWERING_DOWN).
- With AccountingStorageType=accounting_storage/slurmdbd, a drained node that powers up so
  keeps its DRAIN and loses its reason (without accounting storage it keeps both): the lent
  drain would no longer say it is slonk's, nor a person's why. `keep_reasons` puts it back.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hostlist

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.files import write_atomically
from slonk.config import patterns
from slonk.slurm import reasons, slurm_nodes
from slonk.slurm.slurm_state import NodeState, SlurmError

LENT = "lent"  # the syncer's cause word: `slonk:k8s:lent: <detail>`
# How long `lend` waits for Slurm to start powering a node down (a power-save pass:
# power_save_interval, 1 s as slonk renders it, 10 s by Slurm's default), and a starting
# slurmd for its node to finish powering down (SuspendTimeout and a pass).
POWER_PASS_SECONDS = 15.0
POLL_SECONDS = 0.2
# The hostlist slurmctld hands ResumeProgram is untrusted text: bounded before expanding.
MAX_HOSTLIST_CHARS = 65536
FILES_VERSION = 1  # of the requests and the reasons kept, each {"version", "nodes"}
REQUESTS, REASONS = "power requests", "powered-down reasons"


class PowerError(SlonkError):
    pass


def lent_reason(detail: str) -> str:
    """`slonk:k8s:lent: <detail>`: the syncer's drain of a lent node."""
    return reasons.k8s(LENT, detail)


def is_lent_reason(reason: str) -> bool:
    return reasons.classify(reason) == reasons.Cause(reasons.K8S, LENT)


def is_lent(node: NodeState, on_demand: bool = False) -> bool:
    """Slurm shows the node lent: powered down and, unless Slurm may ask it back for a job
    (capacity.returnOnDemand), drained so that no job is given it."""
    return node.powered_down and not node.powering_up and (on_demand or node.drained)


def _wait(name: str, done: Any, timeout: float) -> NodeState:
    """The node once `done(node)`, or as it is when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    node = slurm_nodes.read_node(name)
    while not done(node) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        node = slurm_nodes.read_node(name)
    return node


def lend(name: str, detail: str, pod_gone: bool, on_demand: bool = False) -> bool:
    """One step toward lending node `name`, whose ordinal is lent; True once Slurm shows it
    lent (`is_lent`). Call again until then: each call does what the node's state asks, and
    nothing on a node Slurm is powering up for a job.

    Drain it `slonk:k8s:lent: <detail>` (a drain already there, a person's, stays); once its
    pod is gone (a pod stopping undrained would set it DOWN) and no job runs on it, power it
    down. Slurm clears the drain as it starts powering down and keeps the reason: the drain
    is set again then, with that reason, unless `on_demand` and the reason is the lent one.
    Never kills a job: POWER_DOWN waits for the node to be idle."""
    node = slurm_nodes.read_node(name)
    if node.powering_up or is_lent(node, on_demand):
        _kept([node])
        return is_lent(node, on_demand)
    if not (node.powering_down or node.powered_down):
        if pod_gone and node.state == "down" and _cause(node) == reasons.POD:
            # The pod stopped undrained and set its node DOWN (rootfs' svscan/SIGTERM): it
            # is lent now, not broken. Slurm powers a DOWN node down as `down~`.
            slurm_nodes.resume(name)
        if not node.drained:
            slurm_nodes.drain(name, lent_reason(detail))
        node = slurm_nodes.read_node(name)
        if not pod_gone or node.state != "idle":
            return False  # jobs still run: safe removal waits for them, and so does lending
        slurm_nodes.scontrol("update", f"nodename={name}", "state=power_down")
        node = _wait(name, lambda n: "POWER_DOWN" not in n.flags, POWER_PASS_SECONDS)
    if (
        not node.drained
        and not node.powering_up
        and not (on_demand and is_lent_reason(node.reason))
    ):
        slurm_nodes.drain(name, node.reason or lent_reason(detail))
        node = slurm_nodes.read_node(name)
    _kept([node])  # before its pod can come back and its slurmd register
    return is_lent(node, on_demand)


def _cause(node: NodeState) -> str | None:
    cause = reasons.classify(node.reason)
    return cause.kind if cause else None


def give_back(name: str) -> bool:
    """Node `name`'s pod runs again: True once Slurm has it back. Its slurmd's registration
    powers it up (nothing to ask Slurm: no POWER_UP, which would wait for a new boot); then
    the lent drain, and only that, is lifted. False while Slurm still shows it powered down
    or waits for it (call again)."""
    (node,) = _kept([slurm_nodes.read_node(name)])
    if node.powering_down or not node.up:
        return False
    if node.drained and is_lent_reason(node.reason):
        try:
            slurm_nodes.resume(name)
        except SlurmError:
            # Resumed meanwhile (by hand, by another call): done all the same.
            node = slurm_nodes.read_node(name)
            if node.drained and is_lent_reason(node.reason):
                raise
    return True


def keep_reasons(nodes: Iterable[NodeState]) -> list[NodeState]:
    """The nodes as Slurm shows them once the reason of each drained one it shows powered
    down is kept (paths.POWERED_DOWN_REASONS) and each kept reason is back on its node, up
    again, drained and without one (Slurm forgot it powering up). A reason kept is dropped
    once its node is up; meanwhile a newer one replaces it."""
    found = list(nodes)
    path = paths.POWERED_DOWN_REASONS
    with _locked(path):
        kept = _read_nodes(path, REASONS)
        before = dict(kept)
        for i, node in enumerate(found):
            if node.up and node.name in kept:
                reason = kept.pop(node.name)
                if node.drained and not node.reason:
                    slurm_nodes.drain(node.name, reason)
                    found[i] = slurm_nodes.read_node(node.name)
            elif node.powered_down and node.drained and node.reason:
                kept[node.name] = node.reason
        if kept != before:
            _write_nodes(kept, path)
    return found


def _kept(nodes: list[NodeState]) -> list[NodeState]:
    """keep_reasons, whose file must not stop lending or giving back: a file that cannot be
    read or written is the syncer's to say (each pass's snapshot calls keep_reasons too)."""
    try:
        return keep_reasons(nodes)
    except PowerError:
        return nodes


def slurmd_flags(name: str) -> list[str]:
    """Options for node `name`'s starting slurmd: `-b` (report a boot now) when Slurm is
    powering the node up, as it then takes only a slurmd booted since, which a pod's (the
    host's) uptime never shows. A power-down in progress is waited out first: Slurm ignores
    a registration during it. On any error, none: slurmd starts as it always did."""
    try:
        node = _wait(name, lambda n: not n.powering_down, POWER_PASS_SECONDS + 10)
    except (SlonkError, OSError):
        return []
    return ["-b"] if node.powering_up else []


# The requests slurmctld's ResumeProgram records.


def parse_hostlist(text: str) -> list[str]:
    """Node names from a Slurm hostlist (`slonk-gpu-[0-3],slonk-cpu-1`), refused unless each
    is a node name slonk makes: a DNS label."""
    if not text or len(text) > MAX_HOSTLIST_CHARS:
        raise PowerError(f"hostlist: empty or longer than {MAX_HOSTLIST_CHARS} characters")
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as err:
        raise PowerError(f"hostlist {text[:80]!a}: {err}") from None
    for name in names:
        if len(name) > 63 or not patterns.matches(patterns.DNS_LABEL, name):
            raise PowerError(f"hostlist {text[:80]!a}: {name[:80]!a} is no node name")
    return names


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Held over a read-change-replace of the requests: on their directory (slurmctld's
    state, SlurmUser's), which both SlurmUser and root can open, unlike a lock file one of
    them made."""
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise PowerError(f"{path.parent}: cannot open: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_nodes(path: Path, what: str) -> dict[str, str]:
    """{node: text} of one of slonk's files on slurmctld's state; {} when there is none. A
    file that is not slonk's format is an error (never "nothing there")."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise PowerError(f"{path}: cannot read: {err}") from None
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or data.get("version") != FILES_VERSION
        or not isinstance(nodes, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in nodes.items())
    ):
        raise PowerError(f"{path}: not version {FILES_VERSION} of slonk's {what}")
    return dict(nodes)


def _write_nodes(nodes: Mapping[str, str], path: Path) -> None:
    document = {"version": FILES_VERSION, "nodes": dict(sorted(nodes.items()))}
    # Readable by all: node names and drain reasons (`sinfo -R` shows them to all), no
    # secret. SlurmUser (ResumeProgram) reads the requests root (the syncer) wrote, and
    # replaces them, as it owns the directory.
    try:
        write_atomically(path, json.dumps(document, indent=1) + "\n", mode=0o644)
    except OSError as err:
        raise PowerError(f"{path}: cannot write: {err.strerror}") from None


def read_requests(path: Path = paths.POWER_REQUESTS) -> dict[str, str]:
    """{node: UTC time Slurm asked it back}; {} when none."""
    return _read_nodes(path, REQUESTS)


def record_resume(text: str, path: Path = paths.POWER_REQUESTS) -> list[str]:
    """ResumeProgram: add the nodes of hostlist `text` to the requests; returns them. A
    node asked again keeps the time first asked."""
    names = parse_hostlist(text)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with _locked(path):
        requests = read_requests(path)
        for name in names:
            requests.setdefault(name, now)
        _write_nodes(requests, path)
    return names


def forget_requests(names: Iterable[str], path: Path = paths.POWER_REQUESTS) -> None:
    """The syncer: these nodes are back (or no longer asked for)."""
    drop = set(names)
    with _locked(path):
        requests = read_requests(path)
        if drop & set(requests):
            _write_nodes({k: v for k, v in requests.items() if k not in drop}, path)


def asked_back(nodes: Iterable[NodeState], path: Path = paths.POWER_REQUESTS) -> set[str]:
    """The nodes Slurm wants back: recorded by ResumeProgram, or powering up in Slurm's own
    state (which a failed ResumeProgram leaves too)."""
    return set(read_requests(path)) | {n.name for n in nodes if n.powering_up}
