"""What a user can make every node fail (a full /home, a full scratch) does not take the
fleet out of service: one check drains at most its share of the nodes, decided alike by nodes
that fail in the same second; shared dependencies' drains are never recycled or quarantined;
a full scratch is a running job's, not the machine's."""

from __future__ import annotations

import itertools
import json

import pytest

from slonk.align import recycle
from slonk.config.health_checks import SHARED_CHECKS
from slonk.config.spec import RecycleSettings
from slonk.health import blast, checks, drains, probe, runner
from slonk.slurm import slurm_nodes

from . import slurm_json

NAMES = [f"slonk-cpu-{i}" for i in range(10)]
SETTINGS = RecycleSettings(idle_seconds=1, period_seconds=1, max_recycles=2, window_seconds=600)


class Slurm:
    """slurmctld's node table as `scontrol` shows and updates it; `racing` nodes drain in the
    same second as the node the test drives (nodes failing together)."""

    def __init__(self, names: list[str]) -> None:
        self.nodes = {n: {"state": ["IDLE"], "reason": "", "time": 0} for n in names}
        self.clock = itertools.count(1000)
        self.racing: list[str] = []

    def scontrol(self, *args: str) -> str:
        if args[0] == "show":
            names = [a for a in args[2:] if a != "--json"] or list(self.nodes)
            return slurm_json.nodes(*(self._record(n) for n in names))
        _, target, state, *rest = args
        name = target.removeprefix("nodename=")
        if state == "state=drain":
            now = next(self.clock)
            for node in [name, *self.racing]:
                self.nodes[node].update(state=["IDLE", "DRAIN"], time=now)
                self.nodes[node]["reason"] = rest[0].removeprefix("reason=")
            self.racing = []
        elif state == "state=resume":
            assert "DRAIN" in self.nodes[name]["state"], f"{name} resumed while not drained"
            self.nodes[name].update(state=["IDLE"], reason="")
        return ""

    def _record(self, name: str) -> dict:
        node = self.nodes[name]
        record = slurm_json.node(name, node["state"], node["reason"])
        record["reason_changed_at"] = {"set": True, "infinite": False, "number": node["time"]}
        return record

    def drained(self) -> list[str]:
        return [n for n, node in self.nodes.items() if "DRAIN" in node["state"]]


@pytest.fixture
def slurm(monkeypatch) -> Slurm:
    fake = Slurm(NAMES)
    monkeypatch.setattr(slurm_nodes, "scontrol", fake.scontrol)
    monkeypatch.setattr(drains, "CONFIRM_AFTER_SECONDS", 0.0)  # the fake's drains show at once
    return fake


def _fail(check: str) -> list[runner.Result]:
    return [runner.Result(check, False, "/home is not writable: No space left on device", 0.1)]


def test_the_limit_is_a_share_of_the_nodes_and_at_least_one():
    assert [blast.limit(n, 10) for n in (1, 2, 9, 10, 19, 20, 1000)] == [1, 1, 1, 1, 1, 2, 100]
    assert blast.limit(4, 100) == 4


def test_a_full_home_on_every_node_drains_only_the_first(slurm):
    """One user filling /home fails the storage check on every node in turn: one drains,
    the rest stay in service and say why."""
    said = [drains.apply(n, _fail("storage"), undrain=True, max_drained_percent=10) for n in NAMES]
    assert slurm.drained() == ["slonk-cpu-0"]
    assert said[0].startswith("drained: slonk:storage:")
    assert all("a shared dependency's" in s and "left in service" in s for s in said[1:])


@pytest.mark.parametrize(
    ("node", "stays"), [(NAMES[0], True), (NAMES[1], True), (NAMES[2], False), (NAMES[9], False)]
)
def test_nodes_draining_in_the_same_second_agree_which_stay(slurm, node, stays):
    """Every node looked before any drained, and all drain in the same second: each looks
    again, and ordered by reason time, then name, those past the limit (two of ten at 20%)
    undo their own drain. Each node's view is the same, so they agree."""
    slurm.racing = [n for n in NAMES if n != node]
    said = drains.apply(node, _fail("storage"), undrain=True, max_drained_percent=20)
    assert said.startswith("drained:") is stays
    assert (node in slurm.drained()) is stays
    if not stays:
        assert "left in service" in said


def test_a_node_that_raced_past_the_limit_undoes_its_drain(slurm, monkeypatch):
    """Its look before the drain saw room; by its look after, others drained a second
    earlier."""
    drive = slurm.scontrol

    def racing(*args: str) -> str:
        if args[:3] == ("update", f"nodename={NAMES[5]}", "state=drain"):
            for name in NAMES[:3]:
                slurm.nodes[name].update(state=["IDLE", "DRAIN"], reason="slonk:storage: x", time=1)
        return drive(*args)

    monkeypatch.setattr(slurm_nodes, "scontrol", racing)
    said = drains.apply(NAMES[5], _fail("storage"), undrain=True, max_drained_percent=20)
    assert "left in service" in said
    assert slurm.drained() == NAMES[:3]


def test_a_check_under_its_limit_drains_as_before(slurm):
    said = drains.apply(NAMES[3], _fail("gpu"), undrain=True, max_drained_percent=10)
    assert said.startswith("drained: slonk:gpu:")
    other = drains.apply(NAMES[4], _fail("storage"), undrain=True, max_drained_percent=10)
    assert other.startswith("drained: slonk:storage:")  # each check has its own share


def test_a_node_drained_by_the_syncer_keeps_that_drain_past_the_limit(slurm):
    slurm.nodes[NAMES[0]].update(state=["IDLE", "DRAIN"], reason="slonk:storage: x", time=1)
    slurm.nodes[NAMES[1]].update(state=["IDLE", "DRAIN"], reason="slonk:k8s:cordoned: y", time=2)
    said = drains.apply(NAMES[1], _fail("storage"), undrain=True, max_drained_percent=10)
    assert "a shared dependency's" in said
    assert slurm.nodes[NAMES[1]]["reason"] == "slonk:k8s:cordoned: y"


def _drained(name: str, reason: str, state: str = "idle") -> slurm_nodes.NodeState:
    return slurm_nodes.NodeState(name, state, frozenset({"DRAIN"}), reason, "t0")


@pytest.mark.parametrize("check", sorted(SHARED_CHECKS))
def test_a_shared_dependencys_drain_is_never_recycled_or_quarantined(check):
    history = recycle.History()
    node = _drained("slonk-cpu-0", f"slonk:{check}: /home is not writable")
    for now in (0, 100, 10_000, 20_000):
        assert list(recycle.due([node], history, SETTINGS, now)) == []


def test_a_check_holding_more_than_its_share_is_recycled_nowhere():
    """Drains made before the limit (or by an older slonk) are not recycled either."""
    nodes = [_drained(n, "slonk:gpu: driver mismatch") for n in NAMES[:3]]
    nodes += [slurm_nodes.NodeState(n, "idle", frozenset(), "", "t0") for n in NAMES[3:]]
    history = recycle.History()
    for now in (0, 100):
        assert list(recycle.due(nodes, history, SETTINGS, now, max_drained_percent=10)) == []
    # Within the share, the machine's fault is recycled as before.
    one = nodes[:1] + nodes[3:]
    history = recycle.History()
    assert list(recycle.due(one, history, SETTINGS, 0, 10)) == []
    assert [a for a, *_ in recycle.due(one, history, SETTINGS, 100, 10)] == ["recycle"]


def test_a_full_scratch_with_jobs_on_the_node_is_theirs(tmp_path, monkeypatch):
    node = checks.Node(name="slonk-cpu-0", gpus=0, peers=())
    full = {"path": str(tmp_path), "minFreePercent": 101}
    monkeypatch.setattr(checks, "jobs_here", lambda _node: True)
    with pytest.raises(probe.Inconclusive, match="with jobs on the node"):
        checks.check_scratch(node, full, "watch", 5)
    monkeypatch.setattr(checks, "jobs_here", lambda _node: False)
    with pytest.raises(probe.Unhealthy, match="below 101%") as raised:
        checks.check_scratch(node, full, "watch", 5)
    assert not isinstance(raised.value, probe.Inconclusive)


def test_the_limit_reaches_the_nodes_plan():
    from slonk.config.spec import parse_spec

    spec = parse_spec({
        "clusterName": "c",
        "release": "slonk",
        "nodepools": {"cpu": {"replicas": 2, "cpus": 4, "memoryMiB": 1024}},
        "health": {"enabled": True, "maxDrainedPercent": 25},
    })  # fmt: skip
    plan = runner.plan_for(spec, "slonk-cpu-0")
    assert plan is not None and plan.max_drained_percent == 25
    assert runner.parse_plan(json.dumps(runner.asdict(plan)).encode()) == plan


def test_the_second_look_waits_for_the_second_to_pass(slurm, monkeypatch):
    """A look right after the drain could miss another drain stamped with the same second,
    and both nodes keep theirs: the look after comes CONFIRM_AFTER_SECONDS later."""
    calls: list[str] = []
    drive = slurm.scontrol
    monkeypatch.setattr(drains, "CONFIRM_AFTER_SECONDS", 2.0)
    monkeypatch.setattr(drains.time, "sleep", lambda seconds: calls.append(f"sleep {seconds}"))
    monkeypatch.setattr(
        slurm_nodes, "scontrol", lambda *args: calls.append(" ".join(args[:3])) or drive(*args)
    )
    drains.apply(NAMES[0], _fail("storage"), undrain=True, max_drained_percent=10)
    assert calls[-3:] == [
        f"update nodename={NAMES[0]} state=drain",
        "sleep 2.0",
        "show node --json",
    ]


def test_a_full_scratch_with_no_job_is_cleared_of_what_users_left_before_it_is_judged(
    tmp_path, monkeypatch
):
    node = checks.Node(name="slonk-cpu-0", gpus=0, peers=())
    monkeypatch.setattr(checks, "jobs_here", lambda _node: False)
    free = iter([1.0, 50.0])  # full, then free once the leftovers are gone
    monkeypatch.setattr(checks, "_free_percent", lambda _path, _timeout: next(free))
    cleared = ["scratch: removed 3 entries uid 5000 left"]
    monkeypatch.setattr(checks.leftovers, "clean_left_behind", lambda *_args: cleared)
    options = {"path": str(tmp_path), "minFreePercent": 5}
    said = checks.check_scratch(node, options, "watch", 5)
    assert said == f"{tmp_path} 50% free after {cleared[0]}"
    # Still full after: drained, saying what went.
    free = iter([1.0, 2.0])
    with pytest.raises(probe.Unhealthy, match=r"2\.0% free, below 5%, after scratch: removed"):
        checks.check_scratch(node, options, "watch", 5)
    # Nothing a user left (root's own files): judged at once.
    free = iter([1.0])
    monkeypatch.setattr(checks.leftovers, "clean_left_behind", lambda *_args: [])
    with pytest.raises(probe.Unhealthy, match=r"1\.0% free, below 5%$"):
        checks.check_scratch(node, options, "watch", 5)
