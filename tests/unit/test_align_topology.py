"""A flapping Node label cannot make the syncer reconfigure slurmctld again and again: the
topology goes through slonk.align.topology's gate, driven here by a fake clock the way the
syncer's loop drives it (a pass on every change, and one when the gate says a change is due)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slonk.align import syncer, topology
from slonk.config import placement
from slonk.config.spec import ClusterSpec, parse_spec
from slonk.pod import config_watch

NODE = "slonk-gpu-0"
POLL = 5.0  # the syncer's slurmPollSeconds default
RAN = "rewrote topology.conf; slurmctld runs it"


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Slurmctld:
    """Controller.apply's stand-in: what it was asked to run, and when."""

    clock: Clock
    runs: list[tuple[float, dict[str, dict[str, str]]]] = field(default_factory=list)
    not_now: bool = False

    def apply(self, _spec: object) -> str:  # bound to the fake: Controller() is not passed
        if self.not_now:
            raise config_watch.NotNow("slurmctld is not answering")
        self.runs.append((self.clock.now, placement.load()))
        return RAN


@pytest.fixture
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "placement.json"
    monkeypatch.setattr(placement.paths, "PLACEMENT", path)
    monkeypatch.setattr(placement.load, "__defaults__", (path,))
    monkeypatch.setattr(placement.save, "__defaults__", (path,))
    placement.save({NODE: {"block": "nvl1"}})
    os.utime(path, (0, 0))  # applied long ago
    yield path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def slurmctld(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Slurmctld:
    fake = Slurmctld(clock)
    monkeypatch.setattr(config_watch.Controller, "apply", fake.apply)
    return fake


@pytest.fixture
def spec(demo_spec: dict) -> ClusterSpec:
    return parse_spec(demo_spec)


def labelled(block: str) -> dict[str, dict[str, str]]:
    return {NODE: {"block": block}}


def drive(
    gate: topology.Gate, spec: ClusterSpec, changes: list[tuple[float, str]], until: float
) -> list[str]:
    """The syncer's loop, in fake time: a pass at each label change (relative times) and
    whenever `syncer.next_pass` says, until `until` seconds from now. Returns its log."""
    clock, start = gate.clock, gate.clock()
    assert isinstance(clock, Clock)
    pending, block, said = sorted(changes), "nvl1", []
    while clock.now < start + until:
        wake = clock.now + syncer.next_pass(gate, POLL)
        if pending and start + pending[0][0] <= wake:
            clock.now = max(clock.now, start + pending[0][0])
            block = pending.pop(0)[1]
        else:
            clock.now = wake
        said += topology.place(labelled(block), spec, gate)
        clock.now += syncer.MIN_PASS_SECONDS
    return said


def flips(count: int, every: float, final: str) -> list[tuple[float, str]]:
    """`count` changes `every` seconds apart between nvl2 and nvl1, the last one to `final`."""
    other = "nvl1" if final == "nvl2" else "nvl2"
    return [(i * every, final if (count - 1 - i) % 2 == 0 else other) for i in range(count)]


def test_forty_changes_in_forty_seconds_make_at_most_two_reconfigures(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    """The issue's attack: 40 changes 1 s apart used to be 40 re-executions of slurmctld."""
    gate = topology.Gate(clock=clock)
    said = drive(gate, spec, flips(40, 1.0, final="nvl2"), until=120)
    assert 1 <= len(slurmctld.runs) <= 1 + 40 / topology.MIN_INTERVAL_SECONDS
    times = [at for at, _ in slurmctld.runs]
    assert all(b - a >= topology.MIN_INTERVAL_SECONDS for a, b in itertools.pairwise(times))
    assert slurmctld.runs[-1][1] == labelled("nvl2"), "the final labels are what Slurm runs"
    assert placement.load() == labelled("nvl2")
    assert any("coalesced into one reconfigure" in line for line in said), said


def test_a_burst_within_the_window_is_one_reconfigure_of_its_final_state(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    gate = topology.Gate(clock=clock)
    said = drive(gate, spec, flips(25, 0.2, final="nvl2"), until=60)
    assert [p for _, p in slurmctld.runs] == [labelled("nvl2")]
    (at, _) = slurmctld.runs[0]
    assert at - 1_000_000.0 == pytest.approx(topology.WINDOW_SECONDS, abs=0.5)
    line = next(x for x in said if "coalesced" in x)
    assert line.startswith("25 placement change(s) seen in 10 s coalesced into one reconfigure")
    assert f"{NODE} block=nvl2 (was nvl1)" in line


def test_a_label_that_flaps_back_within_the_window_reconfigures_nothing(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    gate = topology.Gate(clock=clock)
    said = drive(gate, spec, flips(24, 0.2, final="nvl1"), until=60)
    assert slurmctld.runs == []
    assert placement.load() == labelled("nvl1")
    assert any("came back to the applied topology: no reconfigure" in x for x in said), said
    assert gate.due() is None, "nothing held: the syncer polls at its own pace again"


def test_one_change_waits_the_window_then_the_interval_since_the_last(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    gate = topology.Gate(clock=clock)
    drive(gate, spec, [(0, "nvl2")], until=12)
    drive(gate, spec, [(0, "nvl3")], until=60)
    first, second = (at for at, _ in slurmctld.runs)
    assert first == pytest.approx(1_000_000.0 + topology.WINDOW_SECONDS, abs=0.5)
    assert second - first == pytest.approx(topology.MIN_INTERVAL_SECONDS, abs=0.5)
    assert placement.load() == labelled("nvl3")


def test_a_restarted_syncer_keeps_the_pace(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    """A syncer that exits (a lost Lease) and comes back reads when the placement was last
    applied from the saved file: a crash loop cannot reconfigure at every start."""
    start = clock.now
    os.utime(saved, (start - 5, start - 5))
    gate = topology.Gate(clock=clock)
    assert gate.applied_at == start - 5
    drive(gate, spec, [(0, "nvl2")], until=60)
    ((at, _),) = slurmctld.runs
    assert at == pytest.approx(start - 5 + topology.MIN_INTERVAL_SECONDS, abs=0.5)


def test_a_clock_set_back_does_not_hold_a_change_for_ever(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    gate = topology.Gate(clock=clock, applied_at=clock.now + 86_400)
    drive(gate, spec, [(0, "nvl2")], until=60)
    assert [p for _, p in slurmctld.runs] == [labelled("nvl2")]


def test_slurmctld_not_answering_holds_the_change_for_another_window(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    gate = topology.Gate(clock=clock)
    slurmctld.not_now = True
    said = drive(gate, spec, [(0, "nvl2")], until=15)
    assert placement.load() == labelled("nvl1"), "kept as a change still to make"
    assert sum("waits for slurmctld" in x for x in said) == 1, "tried once a window, said once"
    slurmctld.not_now = False
    drive(gate, spec, [(0, "nvl2")], until=15)  # the labels as they stayed
    assert [p for _, p in slurmctld.runs] == [labelled("nvl2")]


def test_next_pass_wakes_the_syncer_when_a_held_change_is_due(clock: Clock) -> None:
    gate = topology.Gate(clock=clock, applied_at=None)
    assert syncer.next_pass(gate, POLL) == POLL
    gate.offer(labelled("nvl1"), labelled("nvl2"))
    clock.now += 8
    assert syncer.next_pass(gate, POLL) == pytest.approx(2)
    clock.now += 5  # overdue (the pass was skipped): the usual poll, never a spin
    assert syncer.next_pass(gate, POLL) == POLL


def test_align_fix_applies_at_once(
    saved: Path, clock: Clock, slurmctld: Slurmctld, spec: ClusterSpec
) -> None:
    """`slonk align --fix` is a person's one pass: no gate."""
    said = topology.place(labelled("nvl2"), spec)
    assert [p for _, p in slurmctld.runs] == [labelled("nvl2")]
    assert said == [f"placement changed ({NODE} block=nvl2 (was nvl1)): " + RAN]


def test_a_node_not_found_keeps_its_last_place() -> None:
    saved = {"a": {"block": "b1"}, "b": {"block": "b2"}}
    assert topology.merged(saved, {"b": {"block": "b3"}}) == {
        "a": {"block": "b1"},
        "b": {"block": "b3"},
    }


def test_the_log_names_a_bounded_number_of_moved_nodes() -> None:
    old = {f"n{i}": {"switch": "s1"} for i in range(9)}
    new = {f"n{i}": {"switch": "s2"} for i in range(9)}
    line = topology.moved(old, new)
    assert line.count("(was s1)") == topology.SHOWN_NODES and line.endswith("and 4 more")
