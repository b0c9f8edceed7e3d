"""slonk.pod.worker_stop's decisions against a Slurm that answers from a script, on a clock that
only moves when the code sleeps: what is drained, waited for, requeued, marked down, lifted."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from slonk.pod import worker_stop
from slonk.slurm import reasons
from slonk.slurm.slurm_state import Job, NodeState, SlurmError, SlurmNotInstalled

NAME = "slonk-cpu-1"
ROOTFS = Path(__file__).parents[2] / "rootfs"


def _node(state: str = "idle", *flags: str, reason: str = "", started: str = "100") -> NodeState:
    return NodeState(NAME, state, frozenset(flags), reason, slurmd_started=started)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        assert 0 <= seconds <= worker_stop.POLL_SECONDS
        self.sleeps.append(seconds)
        self.t += seconds or 0.001


class FakeSlurm:
    """`node(t)` gives the node at clock time t (None: no such node; raise: no answer)."""

    def __init__(
        self,
        clock: Clock,
        node: Callable[[float], NodeState | None],
        jobs: list[Job] = (),  # type: ignore[assignment]
        refuse: frozenset[str] = frozenset(),
        unanswered: frozenset[str] = frozenset(),
    ) -> None:
        self.clock, self._node, self.jobs, self.refuse = clock, node, list(jobs), refuse
        self.unanswered = unanswered
        self.commands: list[tuple[str, ...]] = []

    def node(self, name: str) -> NodeState | None:
        assert name == NAME
        return self._node(self.clock.t)

    def jobs_on(self, name: str) -> list[Job]:
        return self.jobs

    def run(self, *command: str) -> None:
        self.commands.append(command)
        if command[:2] == ("scontrol", "requeue") and command[2] in self.refuse:
            raise SlurmError(f"Requested operation is presently disabled for job {command[2]}")
        if command[:2] == ("scontrol", "requeue") and command[2] in self.unanswered:
            raise SlurmError("scontrol requeue timed out")


def _stop(slurm: FakeSlurm, timeout: float = 10) -> tuple[int, list[str]]:
    lines: list[str] = []
    clock = worker_stop._Clock(lambda: slurm.clock.t, slurm.clock.sleep)
    return worker_stop.stop(slurm, NAME, timeout, lines.append, clock), lines


DRAIN = ("scontrol", "update", f"nodename={NAME}", "state=drain", f"reason={worker_stop.REASON}")


def test_the_reason_is_reasons_pod_kind():
    assert worker_stop.REASON.startswith(f"{reasons.PREFIX}{reasons.POD}: ")
    assert reasons.classify(worker_stop.REASON) == reasons.Cause(reasons.POD, reasons.POD)


def test_an_idle_node_is_drained_and_the_hook_returns_at_once():
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t: _node())
    assert _stop(slurm) == (0, [f"drained {NAME}: {worker_stop.REASON}", f"{NAME} holds no job"])
    assert slurm.commands == [DRAIN]
    assert clock.sleeps == []


@pytest.mark.parametrize(
    "reason", ["maintenance", "slonk:gpu: XID 79", "slonk:k8s:cordoned: node-1", "slonk:pod: x"]
)
def test_a_drain_that_stands_is_left_as_it_is(reason):
    slurm = FakeSlurm(Clock(), lambda t: _node("idle", "DRAIN", reason=reason))
    assert _stop(slurm)[0] == 0
    assert slurm.commands == []


def test_jobs_that_end_within_the_timeout_are_waited_for_not_requeued():
    clock = Clock()
    slurm = FakeSlurm(
        clock,
        lambda t: _node("mixed") if t == 0 else _node("mixed", "DRAIN") if t < 3
        else _node("idle", "DRAIN", "COMPLETING") if t < 4 else _node("idle", "DRAIN"),
        jobs=[Job("7", "RUNNING", (NAME,))],
    )  # fmt: skip
    assert _stop(slurm, timeout=10)[0] == 0
    assert slurm.commands == [DRAIN]
    assert 4 <= clock.t < 5  # asked once a POLL_SECONDS, no longer


def test_what_outlasts_the_timeout_is_requeued_and_what_cannot_be_is_cancelled():
    clock = Clock()
    requeued_at: list[float] = []

    def node(t: float) -> NodeState:
        done = any(c[:2] == ("scontrol", "requeue") for c in slurm.commands)
        if done and not requeued_at:
            requeued_at.append(t)
        return _node("idle", "DRAIN") if done and t > requeued_at[0] + 2 else _node("mixed")

    jobs = [
        Job("1", "RUNNING", (NAME,)),
        Job("2", "RUNNING", (NAME, "slonk-cpu-0")),
        Job("3", "RUNNING", (NAME,)),  # --no-requeue or interactive
        Job("4", "PENDING", ()),
        Job("5", "COMPLETING", (NAME,)),
    ]
    slurm = FakeSlurm(clock, node, jobs, refuse=frozenset({"3"}))
    code, lines = _stop(slurm, timeout=10)
    assert code == 0
    assert slurm.commands[1:] == [
        ("scontrol", "requeue", "1"),
        ("scontrol", "requeue", "2"),
        ("scontrol", "requeue", "3"),
        ("scancel", "3"),
    ]
    assert 10 <= requeued_at[0] < 10 + worker_stop.POLL_SECONDS + 0.01
    assert any(line.startswith("cancelled job 3: Slurm will not requeue it") for line in lines)


def test_a_requeue_slurm_did_not_answer_cancels_nothing():
    """It may have gone through: a cancel would end the job for good. Slurm requeues a
    batch job itself once the node is DOWN."""
    jobs = [Job("1", "RUNNING", (NAME,))]
    slurm = FakeSlurm(Clock(), lambda t: _node("mixed"), jobs, unanswered=frozenset({"1"}))
    code, lines = _stop(slurm, timeout=2)
    assert code == 1
    assert ("scancel", "1") not in slurm.commands
    assert "could not requeue job 1: scontrol requeue timed out" in lines


def test_no_answer_while_waiting_is_no_reason_to_requeue_early():
    clock = Clock()

    def node(t: float) -> NodeState:
        if t == 0:
            return _node("mixed")
        if t < 10:
            raise SlurmError("slurmctld does not answer")
        return _node("mixed", "DRAIN") if t < 12 else _node("idle", "DRAIN")

    slurm = FakeSlurm(clock, node, [Job("1", "RUNNING", (NAME,))])
    assert _stop(slurm, timeout=10)[0] == 0
    assert [c[:2] for c in slurm.commands] == [("scontrol", "update"), ("scontrol", "requeue")]


def test_jobs_still_there_after_the_requeue_wait_fail_the_hook():
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t: _node("allocated", "DRAIN"), [Job("1", "RUNNING", (NAME,))])
    code, lines = _stop(slurm, timeout=5)
    assert code == 1 and lines[-1] == f"{NAME} still holds jobs; stopping anyway"
    assert clock.t <= 5 + worker_stop.REQUEUE_WAIT_SECONDS + 2 * worker_stop.POLL_SECONDS


def test_a_node_slurm_does_not_know_ends_the_hook():
    unknown = FakeSlurm(Clock(), lambda t: None)
    assert _stop(unknown) == (0, [f"{NAME} is no Slurm node: nothing to drain"])


def test_a_controller_away_is_asked_again_until_the_deadline():
    """A controller restarting (helm upgrade) must not let the pod stop with its jobs."""

    def back_at_4(t: float) -> NodeState:
        if t < 4:
            raise SlurmError("scontrol show timed out")
        return _node("allocated") if t < 7 else _node("idle", "DRAIN")

    slurm = FakeSlurm(Clock(), back_at_4, [Job("1", "RUNNING", (NAME,))])
    code, lines = _stop(slurm)
    assert code == 0 and DRAIN in slurm.commands
    assert lines[0] == f"cannot drain {NAME} yet, asking again: scontrol show timed out"
    assert slurm.clock.t >= 7, "it waited for the job after draining"

    def away(t: float) -> NodeState:
        raise SlurmError("scontrol show timed out")

    clock = Clock()
    code, lines = _stop(FakeSlurm(clock, away))
    assert code == 1 and lines[-1] == f"could not drain {NAME}: scontrol show timed out"
    assert clock.t >= 10, "given up only at the deadline"


UPDATE = ("scontrol", "update", f"nodename={NAME}")


@pytest.mark.parametrize(
    ("node", "commands"),
    [
        (_node("idle"), [(*UPDATE, "state=down", f"reason={worker_stop.REASON}")]),
        # ours: DOWN keeps DRAIN (Slurm 24.11), so it is lifted after, leaving DOWN alone
        (
            _node("idle", "DRAIN", reason=worker_stop.REASON),
            [(*UPDATE, "state=down", f"reason={worker_stop.REASON}"), (*UPDATE, "state=undrain")],
        ),
        (_node("idle", "DRAIN", reason="maintenance"), []),
        (_node("mixed", "DRAIN", reason="slonk:gpu: XID 79"), []),
        (_node("idle", "DRAIN", reason="slonk:k8s:cordoned: node-1"), []),
    ],
)
def test_down_marks_the_node_down_unless_anothers_drain_stands(node, commands):
    slurm = FakeSlurm(Clock(), _until_marked(node, lambda: slurm))
    assert _down(slurm)[0] == 0
    assert slurm.commands == commands


def _until_marked(
    before: NodeState, slurm: Callable[[], FakeSlurm]
) -> Callable[[float], NodeState]:
    """The node as given until slonk marks it down, then DOWN and not responding."""
    down = _node("down", "NOT_RESPONDING", reason=worker_stop.REASON)
    return lambda t: down if slurm().commands else before


def _down(slurm: FakeSlurm) -> tuple[int, list[str]]:
    lines: list[str] = []
    clock = worker_stop._Clock(lambda: slurm.clock.t, slurm.clock.sleep)
    return worker_stop.down(slurm, NAME, lines.append, clock), lines


MARK = [(*UPDATE, "state=down", f"reason={worker_stop.REASON}"), (*UPDATE, "state=undrain")]


def test_down_asks_a_busy_controller_again():
    """Slurm not answering for a while (a controller restarting) still ends DOWN: left
    drained, the node would stay out until the new pod's release."""
    ours = _until_marked(_node("idle", "DRAIN", reason=worker_stop.REASON), lambda: slurm)

    def node(t: float) -> NodeState:
        if t < 3:
            raise SlurmError("scontrol timed out")
        return ours(t)

    slurm = FakeSlurm(Clock(), node)
    code, lines = _down(slurm)
    assert code == 0 and any(line.startswith("marked") for line in lines)
    assert slurm.commands == MARK


@pytest.mark.parametrize(
    "back_flags",
    [
        # slurmctld handled an answer slurmd sent before it stopped after the DOWN: with
        # ReturnToService=2 that returns the node (seen in CI).
        (),
        # The late answer came between the first mark's `state=down` and its `undrain`,
        # which then resumed the node; slurmctld had found slurmd gone meanwhile: out of
        # service only until it answers (seen under load).
        ("NOT_RESPONDING",),
    ],
    ids=["answering", "not-answering"],
)
def test_a_node_a_late_message_returned_is_marked_down_again(back_flags):
    """It is held DOWN a while, and marked DOWN again whenever it shows back in service."""
    clock = Clock()
    down = _node("down", "NOT_RESPONDING", reason=worker_stop.REASON)
    back = _node("idle", *back_flags, reason=worker_stop.REASON)

    def node(t: float) -> NodeState:
        marks = sum("state=down" in c for c in slurm.commands)
        if marks == 0:
            return _node("idle", "DRAIN", reason=worker_stop.REASON)
        return back if marks == 1 and t >= 2 else down

    slurm = FakeSlurm(clock, node)
    code, lines = _down(slurm)
    assert code == 0
    assert slurm.commands == [*MARK, (*UPDATE, "state=down", f"reason={worker_stop.REASON}")]
    assert "again" in lines[-1]
    assert clock.t >= 2 + worker_stop.DOWN_HOLD_SECONDS


def test_a_missing_scontrol_ends_the_hook_and_the_mark_at_once():
    """A pod without Slurm's commands (another image) is not "not yet": asking again until
    the deadline would only hold the pod's stop."""

    def missing(t: float) -> NodeState:
        raise SlurmNotInstalled("scontrol: No such file or directory")

    clock = Clock()
    code, lines = _stop(FakeSlurm(clock, missing))
    assert (code, clock.t) == (1, 0.0)
    assert lines == [f"could not drain {NAME}: scontrol: No such file or directory"]
    code, lines = _down(FakeSlurm(clock, missing))
    assert (code, clock.t) == (1, 0.0)
    assert lines == [f"could not mark {NAME} down: scontrol: No such file or directory"]


def test_down_gives_up_at_its_deadline():
    clock = Clock()

    def node(t: float) -> NodeState:
        raise SlurmError("scontrol timed out")

    slurm = FakeSlurm(clock, node)
    code, lines = _down(slurm)
    assert code == 1 and slurm.commands == []
    assert worker_stop.DOWN_WAIT_SECONDS <= clock.t < worker_stop.DOWN_WAIT_SECONDS + 1
    assert lines[-1].startswith("could not mark")


def _release(slurm: FakeSlurm, since: int = 100) -> tuple[int, list[str]]:
    lines: list[str] = []
    clock = worker_stop._Clock(lambda: slurm.clock.t, slurm.clock.sleep)
    return worker_stop.release(slurm, NAME, since, lines.append, clock), lines


def test_the_new_pod_lifts_the_pod_drain_once_its_slurmd_registered():
    clock = Clock()
    ours = worker_stop.REASON

    def node(t: float) -> NodeState:
        if t < 2:  # the old registration, then the controller away, then not responding
            return _node("idle", "DRAIN", reason=ours, started="50")
        if t < 4:
            raise SlurmError("no answer")
        if t < 6:
            return _node("idle", "DRAIN", "NOT_RESPONDING", reason=ours, started="50")
        return _node("idle", "DRAIN", reason=ours, started="101")

    slurm = FakeSlurm(clock, node)
    assert _release(slurm)[0] == 0
    assert slurm.commands == [(*UPDATE, "state=resume")]
    assert 6 <= clock.t < 7


@pytest.mark.parametrize(
    "node",
    [
        _node("idle", "DRAIN", reason="maintenance", started="100"),
        _node("idle", "DRAIN", reason="slonk:gpu: XID 79", started="100"),
        _node("idle", started="100"),
    ],
)
def test_the_new_pod_lifts_no_other_drain(node):
    slurm = FakeSlurm(Clock(), lambda t: node)
    assert _release(slurm)[0] == 0
    assert slurm.commands == []


def test_the_new_pod_gives_up_when_its_slurmd_never_registers():
    clock = Clock()
    never = _node("down", "DRAIN", reason=worker_stop.REASON, started="0")
    slurm = FakeSlurm(clock, lambda t: never)
    code, lines = _release(slurm)
    assert code == 1 and slurm.commands == []
    assert clock.t >= worker_stop.RELEASE_WAIT_SECONDS
    assert "did not register" in lines[-1]


def test_sigterm_stops_slurmd_then_marks_the_node_down():
    """rootfs' svscan/SIGTERM is shell: the order matters (slurmd, or a requeued job's
    slurmstepd, speaking once more after DOWN would return the node at once, with
    ReturnToService=2: seen in CI)."""
    script = (ROOTFS / "usr/share/slonk/svscan/SIGTERM").read_text()
    commands = [line.strip() for line in script.splitlines() if not line.startswith("#")]
    stop = next(i for i, c in enumerate(commands) if re.match(r"s6-svc .*-d slurmd\b", c))
    steps = next(i for i, c in enumerate(commands) if "pgrep -x slurmstepd" in c)
    down = next(i for i, c in enumerate(commands) if "slonk worker down" in c)
    assert stop < steps < down


def test_a_node_slurm_powers_down_is_marked_down_once():
    """A lent node: Slurm clears its drain and powers it down as its pod goes. It shows no
    DOWN, and marking it again would undo the power-down (seen in the lending test)."""
    powering = _node("idle", "POWERING_DOWN", reason=worker_stop.REASON)
    slurm = FakeSlurm(Clock(), lambda t: powering if slurm.commands else _node("idle"))
    assert _down(slurm)[0] == 0
    assert slurm.commands == [(*UPDATE, "state=down", f"reason={worker_stop.REASON}")]
