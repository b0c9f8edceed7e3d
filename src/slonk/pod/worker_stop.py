"""A worker pod going away kills no job by surprise, and its node comes back with the new pod.

  stop     the slurmd container's preStop hook (`slonk worker stop --timeout N`), run by kubelet
           on any deletion (scale-down, `kubectl delete`, an eviction, the recycle loop) before
           SIGTERM: drain the node unless it is drained already (a person's, a health check's or
           the syncer's drain stays as it is), wait up to N seconds for its jobs to end, then
           requeue what still runs. A job Slurm will not requeue (interactive, `--no-requeue`)
           is cancelled: the pod's end would kill it anyway, and cancelled now it is over at
           once, not when the controller notices the node is gone.
  down     rootfs' svscan/SIGTERM, after s6 stopped slurmd: the node is marked DOWN as
           `slonk:pod: stopping` unless someone else's drain stands. Our own drain becomes a
           plain DOWN (`scontrol update state=down` keeps DRAIN, `state=undrain` then lifts it
           alone; measured on Slurm 24.11): with ReturnToService=2 the new pod's slurmd
           registering returns the node, and its first health run sees it undrained.
  release  the new pod's, started by `slonk init` beside s6: if the old pod could not hand
           its drain over (killed, the controller away), lift the `slonk:pod:` drain once the
           new slurmd registered. Never any other drain.

Slurm's state is read as JSON (slonk.slurm.slurm_state), never its text: reasons are anyone's.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Protocol

from slonk.slurm import reasons, slurm_nodes
from slonk.slurm.slurm_state import (
    OFF_FLAGS,
    QUEUE,
    RUNNING_STATES,
    Job,
    NodeState,
    SlurmError,
    SlurmNotInstalled,
    parse_jobs,
)

# The one reason this module writes; a constant detail, so nothing untrusted to clean.
REASON = f"{reasons.PREFIX}{reasons.POD}: stopping"
POLL_SECONDS = 1.0  # Slurm's state is asked at most this often while waiting
# After the timeout: time for the requeued jobs' epilogs before preStop returns anyway (the
# pod's grace holds workers.stopMarginSeconds for this and for stopping slurmd).
REQUEUE_WAIT_SECONDS = 30.0
# `down` asks Slurm again until this, and holds the node DOWN this long after marking it;
# rootfs' svscan/SIGTERM gives it a little more than the wait.
DOWN_WAIT_SECONDS = 12.0
DOWN_HOLD_SECONDS = 5.0
RELEASE_WAIT_SECONDS = 600.0  # the new pod gives up lifting after this (logged)
REQUEUE_STATES = frozenset({"RUNNING", "SUSPENDED"})
# What `scontrol requeue` says of a job Slurm will never requeue (ESLURM_DISABLED for
# --no-requeue, ESLURM_BATCH_ONLY for srun and salloc): only those are cancelled.
NOT_REQUEUEABLE = ("Requested operation is presently disabled", "Only batch jobs are accepted")


class Slurm(Protocol):
    def node(self, name: str) -> NodeState | None: ...
    def jobs_on(self, name: str) -> list[Job]: ...
    def run(self, *command: str) -> None: ...


class Scontrol:
    """Slurm through its commands, from the pod (configless: they find the controller)."""

    def node(self, name: str) -> NodeState | None:
        return slurm_nodes.find_node(name)

    def jobs_on(self, name: str) -> list[Job]:
        return parse_jobs(self._output(*QUEUE, f"--nodelist={name}"))

    def run(self, *command: str) -> None:
        self._output(*command)

    @staticmethod
    def _output(*command: str) -> str:
        return slurm_nodes.run(list(command))


def holds_jobs(node: NodeState) -> bool:
    """A job runs on the node, or is still ending there (its epilog)."""
    return node.state in ("allocated", "mixed") or "COMPLETING" in node.flags


class _Clock:
    def __init__(
        self, now: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.now, self.sleep = now, sleep


def _wait_empty(slurm: Slurm, name: str, deadline: float, clock: _Clock) -> bool:
    """Whether the node holds no job before `deadline`. A failed read is no answer: the wait
    goes on (fail closed: no requeue for want of a reading)."""
    while True:
        try:
            node = slurm.node(name)
            if node is None or not holds_jobs(node):
                return True
        except SlurmError:
            pass
        if clock.now() >= deadline:
            return False
        clock.sleep(min(POLL_SECONDS, max(0.0, deadline - clock.now())))


def _requeue(slurm: Slurm, name: str, log: Callable[[str], None]) -> None:
    for job in slurm.jobs_on(name):
        if name not in job.nodes or job.state not in REQUEUE_STATES:
            continue  # pending, or ending already
        try:
            slurm.run("scontrol", "requeue", job.id)
            log(f"requeued job {job.id}")
        except SlurmError as err:
            if not any(said in str(err) for said in NOT_REQUEUEABLE):
                # No answer is no refusal: the requeue may even have gone through. Slurm
                # requeues a batch job itself once the node is DOWN.
                log(f"could not requeue job {job.id}: {err}")
                continue
            slurm.run("scancel", job.id)  # interactive or --no-requeue: it dies with the pod
            log(f"cancelled job {job.id}: Slurm will not requeue it ({err})")


def _given_up(err: SlurmError, deadline: float, clock: _Clock) -> bool:
    """Whether a failed Slurm call ends a wait: past its deadline, or no Slurm command to ask
    (a pod of another image), which asking again cannot mend."""
    return clock.now() >= deadline or isinstance(err, SlurmNotInstalled)


def _drain(
    slurm: Slurm, name: str, deadline: float, log: Callable[[str], None], clock: _Clock
) -> NodeState | None:
    """Drain the node unless a drain stands; Slurm not answering (a controller restarting) is
    asked again until the deadline, never taken as leave to stop the jobs at once."""
    while True:
        try:
            node = slurm.node(name)
            if node is None or node.drained:
                if node is not None:
                    log(f"{name} is drained already ({node.reason!a}): left as it is")
                return node
            slurm.run("scontrol", "update", f"nodename={name}", "state=drain", f"reason={REASON}")
            log(f"drained {name}: {REASON}")
            return node
        except SlurmError as err:
            if _given_up(err, deadline, clock):
                raise
            log(f"cannot drain {name} yet, asking again: {err}")
            clock.sleep(min(POLL_SECONDS, max(0.0, deadline - clock.now())))


def stop(
    slurm: Slurm, name: str, timeout: float, log: Callable[[str], None], clock: _Clock | None = None
) -> int:
    """The preStop hook; 0 when the node holds no job as it returns."""
    clock = clock or _Clock()
    deadline = clock.now() + timeout
    try:
        node = _drain(slurm, name, deadline, log, clock)
        if node is None:
            log(f"{name} is no Slurm node: nothing to drain")
            return 0
        if _wait_empty(slurm, name, deadline, clock):
            log(f"{name} holds no job")
            return 0
        log(f"{name} still runs jobs after {timeout:g} s: requeueing them")
        _requeue(slurm, name, log)
    except SlurmError as err:
        log(f"could not drain {name}: {err}")
        return 1
    if _wait_empty(slurm, name, clock.now() + REQUEUE_WAIT_SECONDS, clock):
        return 0
    log(f"{name} still holds jobs; stopping anyway")
    return 1


def down(slurm: Slurm, name: str, log: Callable[[str], None], clock: _Clock | None = None) -> int:
    """After slurmd stopped: DOWN as `slonk:pod: stopping`, unless another's drain stands,
    and kept DOWN for DOWN_HOLD_SECONDS: a message the node sent before it stopped (a ping's
    answer slurmctld handles late) returns a DOWN node to service (ReturnToService=2).
    Slurm not answering (a busy or restarting controller) is asked again until
    DOWN_WAIT_SECONDS: left drained, the node would stay so until the new pod's release."""
    clock = clock or _Clock()
    deadline = clock.now() + DOWN_WAIT_SECONDS
    marked_at: float | None = None
    while True:
        try:
            node = slurm.node(name)
            if node is None:
                return 0
            if drained_by_another(node):
                log(f"{name} left drained ({node.reason!a})")
                return 0
            # Again only once it is back in service, answering or not (a message slurmctld
            # handled late returns it, and the `undrain` of the first mark then resumes it):
            # a node Slurm powers down (lent) shows no DOWN, and marking it again would undo
            # the power-down.
            if marked_at is None or back_in_service(node):
                _mark_down(slurm, node)
                again = (
                    " again: it came back before slurmctld saw it stop"
                    if marked_at is not None
                    else ""
                )
                log(f"marked {name} down{again}: {REASON}")
                marked_at = clock.now()
            marked_at = marked_at if marked_at is not None else clock.now()
            if clock.now() - marked_at >= DOWN_HOLD_SECONDS:
                return 0
        except SlurmError as err:
            if _given_up(err, deadline, clock):
                log(f"could not mark {name} down: {err}")
                return 1
            log(f"cannot mark {name} down yet, asking again: {err}")
        if clock.now() >= deadline:
            return 0 if marked_at is not None else 1
        clock.sleep(min(POLL_SECONDS, max(0.0, deadline - clock.now())))


def drained_by_another(node: NodeState) -> bool:
    """A drain not a stopping pod's (a check's, a person's, the syncer's): it outlives the
    pod, and nothing here marks the node down over it."""
    return node.drained and (node.cause is None or node.cause.kind != reasons.POD)


def back_in_service(node: NodeState) -> bool:
    """Schedulable again once it answers: in a running state, not drained, not powered down."""
    return node.state in RUNNING_STATES and not node.drained and not node.flags & OFF_FLAGS


def _mark_down(slurm: Slurm, node: NodeState) -> None:
    update = ("scontrol", "update", f"nodename={node.name}")
    slurm.run(*update, "state=down", f"reason={REASON}")
    if node.drained:
        slurm.run(*update, "state=undrain")  # DOWN alone: the new slurmd returns it


def release(
    slurm: Slurm, name: str, since: int, log: Callable[[str], None], clock: _Clock | None = None
) -> int:
    """Once a slurmd started at or after `since` (epoch seconds, this pod's start) registered:
    lift a `slonk:pod:` drain. Any other drain, or none, is left as it is."""
    clock = clock or _Clock()
    deadline = clock.now() + RELEASE_WAIT_SECONDS
    while clock.now() < deadline:
        try:
            node = slurm.node(name)
        except SlurmError:
            node = None
        started = node.slurmd_started if node else ""
        if node and node.up and started.isdigit() and int(started) >= since:
            if node.cause is None or node.cause.kind != reasons.POD:
                return 0
            try:
                slurm.run("scontrol", "update", f"nodename={name}", "state=resume")
            except SlurmError as err:
                log(f"could not lift the drain of the pod before: {err}")
                return 1
            log(f"lifted the drain of the pod before ({node.reason!a})")
            return 0
        clock.sleep(POLL_SECONDS)
    log(f"{name} did not register within {RELEASE_WAIT_SECONDS:g} s: no drain lifted")
    return 1


def release_in_background(name: str) -> None:
    """Start `release` beside the pod's start (slonk init), not delaying it: at a cluster's
    start the controller may not answer for a while."""
    # Its lines go to the pod's log, as init's; s6-svscan (init's exec) reaps it.
    since = str(int(time.time()))
    command = [sys.executable, "-m", "slonk.cli", "worker", "--node", name, "release"]
    subprocess.Popen([*command, "--since", since], stdin=subprocess.DEVNULL, start_new_session=True)
