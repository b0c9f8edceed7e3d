"""Active checks that span a block (slonk.align.fabric): their settings, how a failing run is
narrowed down to its node, and the controller's pass, with Slurm's commands stood in for."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import threading
from collections.abc import Callable

import hostlist
import pytest

from slonk.align import active, check_jobs, fabric, narrowing, recycle
from slonk.config import render
from slonk.config.spec import SpecError, parse_spec
from slonk.health import active as node_checks
from slonk.health import runner
from slonk.slurm import gate
from slonk.slurm.slurm_state import NodeState, SlurmError

from ..support.gpu_spec import gpu_and_cpu_pools

NCCL = {"command": "/opt/site/nccl-check --min-busbw 300", "timeoutSeconds": 300, "span": "block"}


def spec_of(replicas: int = 2, **active_settings: object) -> object:
    doc = gpu_and_cpu_pools({"active": {"enabled": True, **active_settings}})
    doc["nodepools"]["gpu"]["replicas"] = replicas
    return parse_spec(doc)


# Settings


def test_a_check_spans_a_node_unless_told_and_a_bad_span_is_refused():
    spec = spec_of(commands={"nccl": NCCL, "dcgm": {**NCCL, "span": None}})
    assert spec.health.active.checks["nccl"].options["span"] == "block"
    assert spec.health.active.checks["dcgm"].options["span"] == "node"
    with pytest.raises(SpecError, match=r"commands\.nccl\.span: must be one of node, block"):
        spec_of(commands={"nccl": {**NCCL, "span": "rack"}})


def test_a_node_keeps_a_block_check_in_its_plan_and_passes_it_at_boot_only():
    spec = spec_of(commands={"nccl": NCCL})
    planned = runner.plan_for(spec, "slonk-gpu-0").checks["active:nccl"]
    # Never in the node's own check job; at boot, where it passes: the recycle was the repair.
    assert planned["phases"] == ["boot"]
    assert node_checks.run_command(planned["options"], 5) == node_checks.BLOCK_AT_BOOT


def test_a_pool_with_block_checks_alone_gets_no_node_check_jobs():
    spec = spec_of(
        checks={"gpu-memory": {"enabled": False}, "gpu-compute": {"enabled": False}},
        commands={"nccl": NCCL},
    )
    nodes = [NodeState("slonk-gpu-0", "idle", frozenset(), "", slurmd_started="1")]
    assert active.due(spec, nodes, active.Schedule(), 10_000.0) == []


def test_the_groups_are_the_topologys_blocks_or_leaf_switches_else_pools():
    doc = gpu_and_cpu_pools({"active": {"enabled": True, "commands": {"nccl": NCCL}}})
    doc["nodepools"]["gpu"]["replicas"] = 4
    assert render.neighbours(parse_spec(doc)) == {
        "gpu": [f"slonk-gpu-{i}" for i in range(4)],
        "cpu": ["slonk-cpu-0"],
    }
    block = copy.deepcopy(doc)
    block["topology"] = "block"
    block["nodepools"]["gpu"]["topology"] = {"block": "nvl1"}
    found = {"slonk-gpu-2": {"block": "nvl2"}, "slonk-gpu-3": {"block": "nvl2"}}
    assert render.neighbours(parse_spec(block), found) == {
        "nvl1": ["slonk-gpu-0", "slonk-gpu-1"],
        "nvl2": ["slonk-gpu-2", "slonk-gpu-3"],
        "cpu": ["slonk-cpu-0"],
    }


# Narrowing a failure down


def search(group: list[str], fails: Callable[[frozenset[str]], bool]) -> tuple[set[str], int]:
    """Run a search to its end against `fails` (whether a run over those nodes fails), from a
    failing run over the whole group: the nodes it names, and how many runs it took."""
    runs = [narrowing.Run(group, False, "1")]
    while tries := narrowing.next_runs(runs, group):
        for t in tries:
            assert len(set(t)) == len(t) >= narrowing.MIN_NODES and set(t) <= set(group), t
        # Made at most twice: an accused node's failing pair, once more before it is named.
        assert sum(frozenset(r.nodes) == frozenset(tries[0]) for r in runs) < 2
        runs.append(narrowing.Run(tries[0], not fails(frozenset(tries[0])), str(len(runs) + 1)))
    return narrowing.named(runs), len(runs)


def nodes(count: int) -> list[str]:
    return [f"n{i:02}" for i in range(count)]


@pytest.mark.parametrize("size", range(3, 21))
def test_one_bad_node_is_named_alone_in_a_few_runs(size):
    most = 0
    for bad in nodes(size):
        named, runs = search(nodes(size), lambda run, bad=bad: bad in run)
        assert named == {bad}, (bad, runs)
        most = max(most, runs)
    # Halves, then two cleared nodes beside it, and one of those pairs again.
    assert most <= 2 * size.bit_length() + 2, most


def test_two_nodes_alone_in_their_group_are_neither_named():
    assert search(nodes(2), lambda run: "n00" in run) == (set(), 1)


@pytest.mark.parametrize("size", range(3, 9))
def test_several_bad_nodes_never_name_a_healthy_one(size):
    missed = 0
    for count in (2, 3):
        for bad in map(set, itertools.combinations(nodes(size), count)):
            named, _ = search(nodes(size), lambda run, bad=bad: bool(run & bad))
            assert named <= bad, (bad, named)
            missed += len(bad - named)
    print(f"{size} nodes: {missed} bad nodes missed over every pair and triple")


@pytest.mark.parametrize(
    "fails",
    [
        pytest.param(lambda run: True, id="every run fails"),
        pytest.param(lambda run: len(run) == 18, id="only the whole group fails"),
    ],
)
def test_a_failure_nothing_narrows_down_names_nobody(fails):
    named, runs = search(nodes(18), fails)
    assert named == set() and runs <= narrowing.MAX_RUNS


@pytest.mark.parametrize("size", range(4, 13))
def test_a_link_down_between_two_sides_names_nobody(size):
    """A group over two switches, the link between them down: every run that spans both
    sides fails, every run within one passes. No node is at fault; none is named, however the
    group's members are ordered, wherever the cut."""
    for cut in range(2, size - 1):
        for order in (nodes(size), nodes(size)[::-1], nodes(size)[1::2] + nodes(size)[::2]):
            left = set(nodes(size)[:cut])
            named, _ = search(order, lambda run, left=left: bool(run & left) and bool(run - left))
            assert named == set(), (cut, order)


def test_a_node_alone_behind_its_link_is_named():
    left = {"n00"}  # its own cable: the node's fault, as far as the group can tell
    named, _ = search(nodes(6), lambda run: bool(run & left) and bool(run - left))
    assert named == {"n00"}


def test_one_failure_beside_a_cleared_node_is_not_enough():
    runs = [
        narrowing.Run(["a", "b", "c", "d"], False, "11"),
        narrowing.Run(["a", "b"], True, "12"),
        narrowing.Run(["c", "a"], False, "13"),
    ]
    assert narrowing.named(runs) == set()
    assert narrowing.next_runs(runs, ["a", "b", "c", "d"])[0] == ["c", "b"]  # a second partner
    runs.append(narrowing.Run(["c", "b"], False, "14"))
    # Accused; named once one of its pairs fails again (the one run made twice).
    assert narrowing.named(runs) == set()
    assert narrowing.next_runs(runs, ["a", "b", "c", "d"])[0] == ["c", "a"]
    runs.append(narrowing.Run(["c", "a"], False, "15"))
    assert narrowing.named(runs) == {"c"}
    said = narrowing.blame("c", runs, "nccl-check")
    assert said == "nccl-check failed beside 2 nodes that pass without it (job 11, 13, 14, 15)"
    # Whether d, the rest of the first run, is sound too (a second fault) is the next run.
    assert narrowing.next_runs(runs, ["a", "b", "c", "d"])[0] == ["d", "a"]


# The controller's pass


@pytest.fixture(autouse=True)
def gate_lock(tmp_path, monkeypatch):
    """The gate's lock beside the test, not in a controller's state directory."""
    monkeypatch.setattr(gate, "LOCK", tmp_path / "slonk-gate.lock")


class Slurm:
    """sbatch, squeue's answers, the drains and the gate's reservation, stood in for: job ids
    count from 100."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
        self.bad, self.submitted, self.drained, self.cancelled = bad, [], [], []
        self.states: dict[str, str] = {}
        self.fails: Callable[[list[str]], bool] = lambda nodes: self.bad in nodes
        self.reserved: set[str] = set()
        self.ends = 0.0  # when Slurm would end the reservation
        self.renewed: list[str] = []
        self.refuse_gate = False  # slurmctld out of reach: changes to the reservation fail
        self.in_reservation: list[bool] = []  # each run's: submitted into the gate's
        monkeypatch.setattr(fabric.slurm_nodes, "run", self.run)
        monkeypatch.setattr(fabric.placement, "load", dict)
        monkeypatch.setattr(fabric.drains, "apply", self.drain)

    def run(self, argv: list[str], **_: object) -> str:
        if argv[0] == "scontrol":
            return self.reservation(argv[1:])
        if argv[0] == "scancel":
            self.cancelled.append(argv[1])
            return ""
        if argv[0] == "squeue":  # the jobs are in `states`, given to the pass
            return ""
        assert argv[0] == "sbatch", argv
        nodes = next(a for a in argv if a.startswith("--nodelist=")).split("=")[1].split(",")
        job = str(100 + len(self.submitted))
        self.submitted.append(nodes)
        self.in_reservation.append(f"--reservation={gate.NAME}" in argv)
        self.states[job] = "FAILED" if self.fails(nodes) else "COMPLETED"
        return f"{job};slonk"

    def reservation(self, args: list[str]) -> str:
        """scontrol's reservation commands, as Slurm 24.11 answers them."""
        if args[:3] == ["show", "reservation", gate.NAME]:
            listed = hostlist.collect_hostlist(sorted(self.reserved))
            ends = {"set": True, "infinite": False, "number": int(self.ends)}
            found = [{"name": gate.NAME, "node_list": listed, "end_time": ends}]
            found = found if self.reserved else []
            return json.dumps({"reservations": found, "errors": []})
        if self.refuse_gate:
            raise SlurmError("scontrol: Unable to contact slurm controller (connect failure)")
        words = dict(a.split("=", 1) for a in args if "=" in a)
        if args[:2] == ["create", "reservation"]:
            assert not self.reserved and words["Users"] == "root" and "FLEX" in words["Flags"]
            self.reserved = set(hostlist.expand_hostlist(words["Nodes"]))
        elif args[0] == "update" and "EndTime" in words:
            self.renewed.append(words["EndTime"])
        elif args[0] == "update":
            key, value = next((k, v) for k, v in words.items() if k.startswith("Nodes"))
            change = set(hostlist.expand_hostlist(value))
            left = self.reserved - change if key == "Nodes-" else self.reserved | change
            assert left, "Slurm refuses a reservation without nodes"
            self.reserved = left
        else:
            assert args == ["delete", f"ReservationName={gate.NAME}"], args
            self.reserved = set()
        return ""

    def nodes(self, count: int) -> list[NodeState]:
        """The pool's nodes, idle, those drained so far drained."""
        return [
            NodeState(n, "idle", frozenset({"DRAIN"} if n in self.drained_nodes else ()), "")
            for n in (f"slonk-gpu-{i}" for i in range(count))
        ]

    @property
    def drained_nodes(self) -> set[str]:
        return {node for node, _, _ in self.drained}

    def drain(self, node, results, undrain, percent, *, planned):
        self.drained.append((node, results[0].reason, planned))
        return f"drained: {results[0].reason}"


def idle(*names: str, started: str = "1") -> list[NodeState]:
    return [NodeState(n, "idle", frozenset(), "", slurmd_started=started) for n in names]


def test_a_pass_runs_a_due_block_then_narrows_its_failure_to_the_node(monkeypatch):
    spec = spec_of(replicas=4, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="slonk-gpu-3")
    schedule, now = fabric.Schedule(), 1000.0
    for _ in range(10):
        fabric.pass_once(spec, schedule, slurm.states, slurm.nodes(4), set(), 5, now, 600.0)
        now += 10
    assert slurm.submitted[0] == [f"slonk-gpu-{i}" for i in range(4)]
    assert [n for n, _, _ in slurm.drained] == ["slonk-gpu-3"]
    _, reason, planned = slurm.drained[0]
    assert reason == (
        "slonk:active:nccl: nccl-check failed beside 2 nodes that pass without it "
        "(job 100, 102, 104, 105)"
    )
    assert "active:nccl" in planned and "active:gpu-memory" in planned  # the node's own plan
    assert slurm.reserved == {"slonk-gpu-3"}  # held: whoever lifts the drain, a run lets it out
    assert schedule.searches["nccl"] == {} and schedule.jobs == {}
    # The nodes it cleared are checked; the drained one is due with its new slurmd.
    assert set(schedule.ran["nccl"]) == {f"slonk-gpu-{i}" for i in range(3)}
    runs = len(slurm.submitted)
    fabric.pass_once(spec, schedule, slurm.states, slurm.nodes(4), set(), 5, now + 100, 600.0)
    assert len(slurm.submitted) == runs


def test_a_first_run_needs_three_quiet_nodes_and_never_takes_a_busy_one(monkeypatch):
    spec = spec_of(replicas=4, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    two = [
        *idle("slonk-gpu-0", "slonk-gpu-1"),
        NodeState("slonk-gpu-2", "allocated", frozenset(), ""),
    ]
    two += [NodeState("slonk-gpu-3", "idle", frozenset({"DRAIN"}), "")]
    schedule = fabric.Schedule()
    # Two idle nodes of four: had their run failed, nothing could tell them apart.
    assert fabric.pass_once(spec, schedule, {}, two, set(), 5, 1000.0, 600.0) == 0
    three = idle("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2")
    assert fabric.pass_once(spec, schedule, {}, three, {"slonk-gpu-1"}, 5, 1000.0, 600.0) == 0
    assert fabric.pass_once(spec, schedule, {}, three, set(), 0, 1000.0, 600.0) == 0
    assert slurm.submitted == []
    assert fabric.pass_once(spec, schedule, {}, three, set(), 5, 1000.0, 600.0) == 1


def test_a_search_takes_a_run_whose_nodes_are_idle_and_waits_for_one(monkeypatch):
    spec = spec_of(replicas=4, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="slonk-gpu-3")
    schedule, everyone = fabric.Schedule(), idle(*(f"slonk-gpu-{i}" for i in range(4)))
    fabric.pass_once(spec, schedule, slurm.states, everyone, set(), 5, 1000.0, 600.0)
    # slonk-gpu-0 taken by a user: the search's first choice (a half with it) waits, the other
    # half runs.
    taken = [NodeState("slonk-gpu-0", "allocated", frozenset(), ""), *everyone[1:]]
    fabric.pass_once(spec, schedule, slurm.states, taken, set(), 5, 1010.0, 600.0)
    assert slurm.submitted[-1] == ["slonk-gpu-2", "slonk-gpu-3"]
    # All taken, past the search's patience: dropped, naming nobody, and the group waits.
    busy = [NodeState(n.name, "allocated", frozenset(), "") for n in everyone]
    fabric.pass_once(spec, schedule, slurm.states, busy, set(), 5, 1020.0, 600.0)
    fabric.pass_once(spec, schedule, slurm.states, busy, set(), 5, 1030.0 + 3600, 600.0)
    assert not schedule.searches["nccl"] and slurm.drained == []
    assert schedule.tried["nccl"]["gpu"] == 1030.0 + 3600  # tried again after the wait
    assert not schedule.ran.get("nccl")  # none cleared: [2, 3] failed too, and 0 waited


def test_a_check_turned_off_has_its_jobs_settled_and_its_state_forgotten(monkeypatch):
    slurm = Slurm(monkeypatch, bad="none")
    on = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    schedule, three = fabric.Schedule(), idle("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2")
    fabric.pass_once(on, schedule, slurm.states, three, set(), 5, 1000.0, 600.0)
    assert schedule.jobs
    off = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": {**NCCL, "enabled": False}})
    fabric.pass_once(off, schedule, slurm.states, three, set(), 5, 1010.0, 600.0)
    assert schedule == fabric.Schedule()


def test_a_search_run_left_pending_is_withdrawn_and_waits(monkeypatch):
    spec = spec_of(replicas=4, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="slonk-gpu-3")
    schedule, everyone = fabric.Schedule(), idle(*(f"slonk-gpu-{i}" for i in range(4)))
    fabric.pass_once(spec, schedule, slurm.states, everyone, set(), 5, 1000.0, 600.0)
    fabric.pass_once(spec, schedule, slurm.states, everyone, set(), 5, 1010.0, 600.0)
    (job,) = schedule.jobs
    slurm.states[job] = "PENDING"  # waiting for the backfill scheduler, for a while
    fabric.pass_once(spec, schedule, slurm.states, everyone, set(), 5, 1020.0, 600.0)
    assert slurm.cancelled == [] and job in schedule.jobs
    withdrawn = 1010.0 + check_jobs.QUEUED_SECONDS
    fabric.pass_once(spec, schedule, slurm.states, everyone, set(), 5, withdrawn, 600.0)
    assert slurm.cancelled == [job] and schedule.jobs == {}
    runs = len(slurm.submitted)
    fabric.pass_once(spec, schedule, slurm.states, everyone, set(), 5, withdrawn + 10, 600.0)
    assert len(slurm.submitted) == runs  # not before 600 s
    fabric.pass_once(spec, schedule, slurm.states, everyone, set(), 5, withdrawn + 600, 600.0)
    assert len(slurm.submitted) == runs + 1


def test_a_preempted_run_is_not_judged_and_waits(monkeypatch):
    spec = spec_of(replicas=2, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    schedule, nodes = fabric.Schedule(), idle("slonk-gpu-0", "slonk-gpu-1")
    fabric.pass_once(spec, schedule, slurm.states, nodes, set(), 5, 1000.0, 600.0)
    (job,) = schedule.jobs
    assert slurm.submitted == [["slonk-gpu-0", "slonk-gpu-1"]]  # all of a group of two
    slurm.states[job] = "PREEMPTED"
    fabric.pass_once(spec, schedule, slurm.states, nodes, set(), 5, 1010.0, 600.0)
    assert schedule.jobs == {} and not schedule.searches.get("nccl")
    assert "nccl" not in schedule.ran
    assert len(slurm.submitted) == 1  # tried again after 600 s, not before
    fabric.pass_once(spec, schedule, slurm.states, nodes, set(), 5, 1610.0, 600.0)
    assert len(slurm.submitted) == 2


def test_a_recycled_nodes_new_slurmd_makes_its_block_due_at_once(monkeypatch):
    spec = spec_of(replicas=2, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    schedule = fabric.Schedule(ran={"nccl": {"slonk-gpu-0": 1000.0, "slonk-gpu-1": 1000.0}})
    fabric.pass_once(
        spec, schedule, {}, idle("slonk-gpu-0", "slonk-gpu-1"), set(), 5, 1100.0, 600.0
    )
    assert slurm.submitted == []
    nodes = [*idle("slonk-gpu-0", started="1050"), *idle("slonk-gpu-1")]
    fabric.pass_once(spec, schedule, {}, nodes, set(), 5, 1100.0, 600.0)
    assert slurm.submitted == [["slonk-gpu-0", "slonk-gpu-1"]]


def test_the_schedule_survives_a_reload(tmp_path, monkeypatch):
    monkeypatch.setattr(fabric.Schedule, "path", tmp_path / "slonk-fabric.json")
    schedule = fabric.Schedule(
        ran={"nccl": {"a": 1.0}},
        tried={"nccl": {"gpu": 2.0}},
        jobs={"7": fabric.Job("nccl", "gpu", ["a", "b"])},
        searches={"nccl": {"gpu": fabric.Search(3.0, [fabric.Run(["a", "b"], False, "6")])}},
        held={"b": 4.0},
        passed={"nccl": {"a": 1.0}},
    )
    schedule.save()
    assert fabric.Schedule.load() == schedule
    (tmp_path / "slonk-fabric.json").write_text('{"ran": [1]}')
    assert fabric.Schedule.load() == fabric.Schedule()


def test_a_run_is_one_job_over_its_nodes_in_the_checks_partition():
    spec = spec_of(replicas=2, commands={"nccl": NCCL})
    argv = fabric.submit_argv(spec.health.active.checks["nccl"], ["slonk-gpu-0", "slonk-gpu-1"], 2)
    for word in (
        "--partition=slonk-active",
        "--nodelist=slonk-gpu-0,slonk-gpu-1",
        "--nodes=2",
        "--exclusive",
        "--gres=gpu:2",
        "--time=6",
    ):
        assert word in argv
    assert "--no-requeue" in argv


def test_a_search_whose_group_is_gone_is_dropped(monkeypatch):
    spec = spec_of(replicas=2, intervalSeconds=600, commands={"nccl": NCCL})
    Slurm(monkeypatch, bad="none")
    failed = narrowing.Run(["slonk-gpu-0", "slonk-gpu-1"], False, "7")
    schedule = fabric.Schedule(searches={"nccl": {"nvl9": fabric.Search(900.0, [failed])}})
    fabric.pass_once(spec, schedule, {}, [], set(), 5, 1000.0, 600.0)
    assert schedule.searches["nccl"] == {} and schedule.tried["nccl"] == {"nvl9": 1000.0}


def test_a_run_whose_program_is_missing_on_a_node_judges_nobody(monkeypatch):
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    schedule = fabric.Schedule()
    fabric.pass_once(spec, schedule, slurm.states, slurm.nodes(3), set(), 5, 1000.0, 600.0)
    (job,) = schedule.jobs
    slurm.states[job] = check_jobs.NOT_HERE
    fabric.pass_once(spec, schedule, slurm.states, slurm.nodes(3), set(), 5, 1010.0, 600.0)
    assert schedule.jobs == {} and not schedule.searches.get("nccl") and slurm.drained == []
    assert schedule.ran["nccl"] == dict.fromkeys(slurm.submitted[0], 1010.0)  # the interval


def test_the_not_here_comment_reads_as_a_state_of_its_own(monkeypatch):
    out = "7 COMPLETED slonk-not-here\n8 COMPLETED (null)\n9 RUNNING \n10 TIMEOUT slonk-not-here\n"
    monkeypatch.setattr(check_jobs.slurm_nodes, "run", lambda argv, **_: out)
    assert check_jobs.states() == {
        "7": check_jobs.NOT_HERE,
        "8": "COMPLETED",
        "9": "RUNNING",
        "10": "TIMEOUT",  # only a run that ended by itself said it
    }


def test_a_drain_slurm_refused_is_tried_again(monkeypatch):
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="slonk-gpu-2")
    refused = []

    def refuse_once(node, results, undrain, percent, *, planned):
        if not refused:
            refused.append(node)
            raise SlurmError("scontrol timed out")
        return slurm.drain(node, results, undrain, percent, planned=planned)

    monkeypatch.setattr(fabric.drains, "apply", refuse_once)
    schedule, now = fabric.Schedule(), 1000.0
    for _ in range(8):
        fabric.pass_once(spec, schedule, slurm.states, slurm.nodes(3), set(), 5, now, 600.0)
        now += 10
    assert refused == ["slonk-gpu-2"] and [n for n, _, _ in slurm.drained] == ["slonk-gpu-2"]


def test_a_search_whose_nodes_left_its_group_is_dropped(monkeypatch):
    spec = spec_of(replicas=2, intervalSeconds=600, commands={"nccl": NCCL})
    Slurm(monkeypatch, bad="none")
    gone = narrowing.Run(["slonk-gpu-0", "slonk-gpu-7"], False, "7")  # gpu-7: scaled away
    schedule = fabric.Schedule(searches={"nccl": {"gpu": fabric.Search(900.0, [gone])}})
    fabric.pass_once(spec, schedule, {}, [], set(), 5, 1000.0, 600.0)
    assert schedule.searches["nccl"] == {} and schedule.tried["nccl"] == {"gpu": 1000.0}


def test_a_program_failing_everywhere_is_not_searched_again_before_the_interval(monkeypatch):
    spec = spec_of(replicas=6, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="")
    slurm.fails = lambda nodes: True
    schedule, now = fabric.Schedule(), 1000.0
    while now < 1000.0 + 600:
        fabric.pass_once(spec, schedule, slurm.states, slurm.nodes(6), set(), 5, now, 600.0)
        now += 10
    assert slurm.drained == []
    whole = [run for run in slurm.submitted if len(run) == 6]
    assert len(whole) == 1 and len(slurm.submitted) <= narrowing.MAX_RUNS


@pytest.mark.parametrize(
    ("program", "step", "status", "comment"),
    [
        pytest.param("echo all good; exit 0", "", 0, "", id="passes"),
        pytest.param(
            "echo run 1; printf 'busbw 12.5 GB/s, under 300\\033[0m\\n'; exit 5",
            "",
            5,
            "slonk-said: busbw 12.5 GB/s, under 300[0m",
            id="fails, its last line in the Comment",
        ),
        pytest.param(None, "", 0, "slonk-not-here", id="missing on a node"),
        pytest.param("exit 0", "exit 1", 2, "", id="a step that cannot start fails the run"),
    ],
)
def test_the_job_looks_for_its_program_on_every_node_then_runs_it(
    tmp_path, program, step, status, comment
):
    """The batch script as sbatch --wrap gives it to sh, with srun (one task: this shell) and
    scontrol stood in for."""
    site = tmp_path / "nccl-check"
    if program is not None:
        site.write_text(f"#!/bin/sh\n{program}\n")
        site.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = step or '[ "$1" = --ntasks-per-node=1 ] && shift 2 && exec "$@"'
    (bin_dir / "srun").write_text(f"#!/bin/sh\n{srun}\n")
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/comment\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    spec = spec_of(replicas=2, commands={"nccl": {**NCCL, "command": str(site)}})
    wrap = fabric.submit_argv(spec.health.active.checks["nccl"], ["a", "b"], 1)[-1]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "TMPDIR": str(tmp_path)}
    done = subprocess.run(["sh", "-c", wrap.removeprefix("--wrap=")], env=env, check=False)
    assert done.returncode == status
    said = (tmp_path / "comment").read_text() if comment else ""
    assert said == (f"update JobId=7 Comment={comment}\n" if comment else "")
    assert not (tmp_path / "slonk-fabric-7.out").exists()  # the program's output, once read


def test_a_node_the_blast_radius_spares_is_not_searched_again_at_once(monkeypatch):
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="slonk-gpu-2")
    spared = []

    def over_the_limit(node, results, undrain, percent, *, planned):
        spared.append(node)
        return "not drained for ...: active:nccl has drained its share of the nodes already"

    monkeypatch.setattr(fabric.drains, "apply", over_the_limit)
    schedule, now = fabric.Schedule(), 1000.0
    for _ in range(20):
        fabric.pass_once(spec, schedule, slurm.states, slurm.nodes(3), set(), 5, now, 600.0)
        now += 10
    assert spared == ["slonk-gpu-2"]  # one search, then the interval
    assert len([run for run in slurm.submitted if len(run) == 3]) == 1


# The gate: a node coming back is held until a run over it passes


def node(name: str, state: str, *flags: str, started: str = "1") -> NodeState:
    return NodeState(name, state, frozenset(flags), "", slurmd_started=started)


def in_the_gate(slurm: Slurm, nodes: list[NodeState]) -> list[NodeState]:
    """The nodes as Slurm shows them, those in the reservation RESERVED."""
    return [
        NodeState(n.name, n.state, n.flags | ({"RESERVED"} if n.name in slurm.reserved else set()),
                  n.reason, slurmd_started=n.slurmd_started)
        for n in nodes
    ]  # fmt: skip


def test_a_node_whose_slurmd_is_gone_is_held_until_a_run_over_it_passes(monkeypatch):
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    three = ("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2")
    schedule = fabric.Schedule(ran={"nccl": dict.fromkeys(three, 900.0)})
    gone = [*idle(*three[:2]), node("slonk-gpu-2", "down", "NOT_RESPONDING")]
    fabric.pass_once(spec, schedule, slurm.states, gone, set(), 5, 1000.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-2"} and slurm.submitted == []
    # Its new pod's slurmd: idle in the gate, due at once, its run in the reservation.
    back = in_the_gate(slurm, [*idle(*three[:2]), *idle("slonk-gpu-2", started="1005")])
    fabric.pass_once(spec, schedule, slurm.states, back, set(), 5, 1010.0, 600.0)
    assert slurm.submitted == [list(three)] and slurm.in_reservation == [True]
    assert slurm.reserved == {"slonk-gpu-2"}  # until the pass after its run passed
    fabric.pass_once(spec, schedule, slurm.states, back, set(), 5, 1020.0, 600.0)
    assert slurm.reserved == set() and schedule.held == {}


def test_a_held_node_that_fails_is_named_drained_and_stays_held(monkeypatch):
    spec = spec_of(replicas=4, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="slonk-gpu-3")
    slurm.reserved = {"slonk-gpu-3"}  # the recycle loop held it before its pod went
    schedule, now = fabric.Schedule(), 1000.0
    for _ in range(10):
        nodes = in_the_gate(slurm, slurm.nodes(4))
        fabric.pass_once(spec, schedule, slurm.states, nodes, set(), 5, now, 600.0)
        now += 10
    assert [n for n, _, _ in slurm.drained] == ["slonk-gpu-3"]
    assert slurm.reserved == {"slonk-gpu-3"} and set(schedule.held) == {"slonk-gpu-3"}
    # Each run over it went into the reservation, the others not.
    assert slurm.in_reservation == ["slonk-gpu-3" in run for run in slurm.submitted]


def test_without_the_gate_or_a_block_check_every_held_node_is_let_out(monkeypatch):
    slurm = Slurm(monkeypatch, bad="none")
    nodes = [node("slonk-gpu-0", "down", "NOT_RESPONDING"), *idle("slonk-gpu-1", "slonk-gpu-2")]
    for spec in (
        spec_of(replicas=3, gate=False, commands={"nccl": NCCL}),
        spec_of(replicas=3, commands={"nccl": {**NCCL, "span": "node"}}),
    ):
        slurm.reserved = {"slonk-gpu-0", "slonk-gpu-1"}
        fabric.pass_once(spec, fabric.Schedule(), {}, nodes, set(), 5, 1000.0, 600.0)
        assert slurm.reserved == set()


def test_a_node_lent_out_is_not_held_and_one_held_before_stays_held(monkeypatch):
    slurm = Slurm(monkeypatch, bad="none")
    lent = [node("slonk-gpu-0", "down", "POWERED_DOWN"), *idle("slonk-gpu-1", "slonk-gpu-2")]
    three = spec_of(replicas=3, commands={"nccl": NCCL})
    fabric.pass_once(three, fabric.Schedule(), {}, lent, set(), 5, 1000.0, 600.0)
    assert slurm.reserved == set()
    # Held as its pod went, then lent: it returns (a scale-up) through a run, not around it.
    slurm.reserved = {"slonk-gpu-0"}
    fabric.pass_once(three, fabric.Schedule(), {}, lent, set(), 5, 1010.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-0"}


def test_a_node_alone_in_its_group_is_never_held(monkeypatch):
    slurm = Slurm(monkeypatch, bad="none")
    one = spec_of(replicas=1, commands={"nccl": NCCL})  # no partner: no run could let it out
    gone = [node("slonk-gpu-0", "down", "NOT_RESPONDING")]
    fabric.pass_once(one, fabric.Schedule(), {}, gone, set(), 5, 1000.0, 600.0)
    assert slurm.reserved == set()
    slurm.reserved = {"slonk-gpu-0"}
    fabric.pass_once(one, fabric.Schedule(), {}, gone, set(), 5, 1010.0, 600.0)
    assert slurm.reserved == set()


def test_a_gate_slurm_cannot_change_now_is_left_for_the_next_pass(monkeypatch, capsys):
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    slurm.refuse_gate = True
    gone = [node("slonk-gpu-0", "down", "NOT_RESPONDING"), *idle("slonk-gpu-1", "slonk-gpu-2")]
    schedule = fabric.Schedule()
    fabric.pass_once(spec, schedule, slurm.states, gone, set(), 5, 1000.0, 600.0)
    assert "gate: not changed this pass" in capsys.readouterr().err
    assert schedule.held == {}
    slurm.refuse_gate = False
    fabric.pass_once(spec, schedule, slurm.states, gone, set(), 5, 1010.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-0"} and schedule.held == {"slonk-gpu-0": 1010.0}


class Kube:
    """The recycle loop's Kubernetes, stood in for."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def pod_place(self, name: str) -> tuple[str, str]:
        return f"machine-{name}", f"uid-{name}"

    def delete_pod(self, name: str, uid: str = "") -> None:
        self.deleted.append(name)

    def quarantine_node(self, pod: str, slurm_node: str, reason: str) -> str:
        return "machine"

    def create_event(self, namespace: str, body: object) -> None:
        pass


def test_the_recycle_loop_holds_a_node_before_its_pod_goes(monkeypatch, capsys):
    doc = gpu_and_cpu_pools(
        {"active": {"enabled": True, "commands": {"nccl": NCCL}}, "recycle": {"idleSeconds": 1}}
    )
    doc["nodepools"]["gpu"]["replicas"] = 3
    spec = parse_spec(doc)
    slurm = Slurm(monkeypatch, bad="none")
    reason = "slonk:active:nccl: nccl-check failed beside 2 nodes that pass without it (job 7)"
    drained = NodeState("slonk-gpu-1", "idle", frozenset({"DRAIN"}), reason, slurmd_started="5")
    monkeypatch.setattr(recycle.slurm_nodes, "read_nodes", lambda: [drained])
    monkeypatch.setattr(recycle.node_events, "record", lambda *args: None)
    kube, history = Kube(), recycle.History(idle_since={"slonk-gpu-1": 0.0})
    slurm.refuse_gate = True  # not held: its pod stays
    recycle.pass_once(spec, kube, history, now=1000.0)
    assert kube.deleted == [] and "could not recycle slonk-gpu-1" in capsys.readouterr().err
    slurm.refuse_gate = False
    recycle.pass_once(spec, kube, history, now=1010.0)
    assert kube.deleted == ["slonk-gpu-1"] and slurm.reserved == {"slonk-gpu-1"}


def test_a_node_not_answering_for_a_moment_or_a_mass_outage_holds_nobody(monkeypatch, capsys):
    spec = spec_of(replicas=4, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    four = [f"slonk-gpu-{i}" for i in range(4)]
    # Slurm lost touch with busy nodes for a ping: their slurmd and jobs are still there.
    moment = [node(n, "allocated", "NOT_RESPONDING") for n in four]
    fabric.pass_once(spec, fabric.Schedule(), {}, moment, set(), 5, 1000.0, 600.0)
    assert slurm.reserved == set()
    # Down all at once: the controller's trouble (or a cluster's first start), not theirs.
    outage = [node(n, "down", "NOT_RESPONDING") for n in four]
    fabric.pass_once(spec, fabric.Schedule(), {}, outage, set(), 5, 1000.0, 600.0)
    assert slurm.reserved == set()
    assert "gate: 4 nodes went down at once, more than 1" in capsys.readouterr().err


def test_only_a_run_that_passed_after_the_hold_lets_a_node_out(monkeypatch):
    """A program failing everywhere: the search names nobody and counts its nodes as checked
    for the schedule, but the held node never passed a run, and stays held."""
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    slurm.fails = lambda nodes: True
    slurm.reserved = {"slonk-gpu-2"}
    schedule, now = fabric.Schedule(), 1000.0
    for _ in range(40):
        nodes = in_the_gate(slurm, idle("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2"))
        fabric.pass_once(spec, schedule, slurm.states, nodes, set(), 5, now, 600.0)
        now += 10
    assert not schedule.searches["nccl"] and slurm.drained == []  # named nobody
    assert slurm.reserved == {"slonk-gpu-2"}
    assert len(slurm.submitted) == 4  # one search, then the interval, held node or not
    slurm.fails = lambda nodes: False  # mended: the next round's run lets it out
    now += 600
    for _ in range(3):
        nodes = in_the_gate(slurm, idle("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2"))
        fabric.pass_once(spec, schedule, slurm.states, nodes, set(), 5, now, 600.0)
        now += 10
    assert slurm.reserved == set()


def test_a_held_node_runs_with_one_partner_when_no_more_are_idle(monkeypatch):
    spec = spec_of(replicas=4, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    slurm.reserved = {"slonk-gpu-3"}
    nodes = [
        *[node(f"slonk-gpu-{i}", "allocated") for i in (0, 1)],
        *in_the_gate(slurm, idle("slonk-gpu-2", "slonk-gpu-3")),
    ]
    fabric.pass_once(spec, fabric.Schedule(), slurm.states, nodes, set(), 5, 1000.0, 600.0)
    assert slurm.submitted == [["slonk-gpu-2", "slonk-gpu-3"]]


def test_active_checks_turned_off_let_every_held_node_out(monkeypatch):
    slurm = Slurm(monkeypatch, bad="none")
    slurm.reserved = {"slonk-gpu-0", "slonk-gpu-1"}
    monkeypatch.setattr(active.control, "in_control", lambda spec, pod: True)
    off = parse_spec(gpu_and_cpu_pools({}))
    stop = threading.Event()
    waits = []

    def wait(timeout=None):  # one pass, then stop if the task has not returned
        waits.append(timeout)
        return len(waits) > 1

    monkeypatch.setattr(stop, "wait", wait)
    active.run_forever(lambda: off, stop)
    assert slurm.reserved == set() and len(waits) == 1
    # Its runs withdrawn first: Slurm deletes no reservation a job uses.
    assert slurm.cancelled == [f"--reservation={gate.NAME}"]


def test_one_busy_node_missing_a_ping_is_not_held(monkeypatch):
    spec = spec_of(replicas=4, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    nodes = [
        node("slonk-gpu-0", "allocated", "NOT_RESPONDING"),
        *idle("slonk-gpu-1", "slonk-gpu-2"),
    ]
    fabric.pass_once(spec, fabric.Schedule(), {}, nodes, set(), 5, 1000.0, 600.0)
    assert slurm.reserved == set()


def test_the_cap_counts_nodes_that_went_down_since_the_last_pass_and_spares_a_stopped_pod(
    monkeypatch,
):
    spec = spec_of(replicas=4, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    schedule = fabric.Schedule()
    dead = [node(f"slonk-gpu-{i}", "unknown", "NOT_RESPONDING") for i in (0, 1)]
    fabric.pass_once(spec, schedule, {}, [*dead, *idle("slonk-gpu-2", "slonk-gpu-3")], set(), 5,
                     1000.0, 600.0)  # fmt: skip
    assert slurm.reserved == set()  # two at once, over the cap (one of four)
    # Those two still down (out for repair): one more going down is held all the same.
    three = [*dead, node("slonk-gpu-2", "down"), *idle("slonk-gpu-3")]
    fabric.pass_once(spec, schedule, {}, three, set(), 5, 1010.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-2"}
    # A pod deleted on purpose (its preStop hook's reason) is held whatever the count.
    stopped = NodeState("slonk-gpu-3", "down", frozenset(), fabric.worker_stop.REASON)
    fabric.pass_once(spec, schedule, {}, [*three[:3], stopped], set(), 5, 1020.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-2", "slonk-gpu-3"}


@pytest.mark.parametrize(
    ("passed", "state", "why"),
    [
        (990.0, node("slonk-gpu-2", "idle", "DRAIN", "RESERVED"), "passed before its hold"),
        (1010.0, node("slonk-gpu-2", "idle", "DRAIN", "RESERVED", started="1020"),
         "passed over its old pod, recycled since"),
        (1030.0, node("slonk-gpu-2", "down", "RESERVED"), "passed, but down now"),
    ],
)  # fmt: skip
def test_a_held_node_stays_held_without_a_pass_over_its_pod_since_its_hold(
    monkeypatch, passed, state, why
):
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    slurm.reserved = {"slonk-gpu-2"}
    schedule = fabric.Schedule(
        held={"slonk-gpu-2": 1000.0},
        passed={"nccl": {"slonk-gpu-2": passed}},
        down=["slonk-gpu-2"],
    )
    nodes = [*idle("slonk-gpu-0", "slonk-gpu-1"), state]
    fabric.pass_once(spec, schedule, {}, nodes, set(), 0, 1040.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-2"}, why


def test_a_run_that_found_its_program_missing_lets_its_held_nodes_out(monkeypatch):
    """The check does not apply to that group, as a node's own check does not apply where its
    program is missing."""
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    slurm.reserved = {"slonk-gpu-2"}
    schedule = fabric.Schedule()
    three = idle("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2")
    fabric.pass_once(spec, schedule, slurm.states, in_the_gate(slurm, three), set(), 5, 1000, 600)
    (job,) = schedule.jobs
    slurm.states[job] = check_jobs.NOT_HERE
    fabric.pass_once(spec, schedule, slurm.states, in_the_gate(slurm, three), set(), 5, 1010, 600)
    assert slurm.reserved == set()


def test_the_backup_controller_waits_for_the_gate_to_open(monkeypatch):
    slurm = Slurm(monkeypatch, bad="none")
    slurm.reserved = {"slonk-gpu-0"}
    assert not active._gate_opened(in_control=False) and slurm.reserved == {"slonk-gpu-0"}
    assert active._gate_opened(in_control=True) and slurm.reserved == set()
    assert active._gate_opened(in_control=False)


def test_no_node_check_goes_to_a_node_a_search_drains_in_the_same_pass(monkeypatch):
    """The pass read the nodes before the search drained one: a check job sent there would
    wait in the queue, and keep the block's next run off the node."""
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    g = [f"slonk-gpu-{i}" for i in range(3)]
    runs = [
        narrowing.Run(g, False, "5"),
        narrowing.Run(g[:2], True, "6"),
        *(narrowing.Run([g[2], g[i]], False, job) for i, job in ((0, "8"), (1, "10"), (0, "12"))),
    ]
    blocks = fabric.Schedule(searches={"nccl": {"gpu": fabric.Search(1000.0, runs)}})
    monkeypatch.setattr(active.slurm_nodes, "read_nodes", lambda: idle(*g))
    plan = active.Schedule()
    active.pass_once(spec, plan, blocks, 2000.0)
    assert [n for n, _, _ in slurm.drained] == ["slonk-gpu-2"] and slurm.reserved == {g[2]}
    assert sorted(plan.jobs.values()) == ["slonk-gpu-0", "slonk-gpu-1"]


def one_run_over_three(monkeypatch, state: str):
    """A pool of three, one run over all three submitted at 1000 and now in `state`."""
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    schedule, three = fabric.Schedule(), idle("slonk-gpu-0", "slonk-gpu-1", "slonk-gpu-2")
    fabric.pass_once(spec, schedule, slurm.states, three, set(), 5, 1000.0, 600.0)
    (job,) = schedule.jobs
    slurm.states[job] = state
    return spec, slurm, schedule, three, job


def test_a_queued_run_whose_nodes_are_taken_is_withdrawn_at_once(monkeypatch):
    spec, slurm, schedule, three, job = one_run_over_three(monkeypatch, "PENDING")
    taken = [node("slonk-gpu-0", "allocated"), *three[1:]]
    fabric.pass_once(spec, schedule, slurm.states, taken, set(), 5, 1010.0, 600.0)
    assert slurm.cancelled == [job] and schedule.tried["nccl"]["gpu"] == 1010.0


def test_a_run_submitted_before_a_nodes_hold_does_not_let_it_out(monkeypatch):
    """Queued while the node was still in service; it went down and came back with the same
    slurmd before the run ended and passed."""
    spec, slurm, schedule, three, job = one_run_over_three(monkeypatch, "RUNNING")
    gone = [*three[:2], node("slonk-gpu-2", "down")]
    fabric.pass_once(spec, schedule, slurm.states, gone, set(), 5, 1010.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-2"}
    slurm.states[job] = "COMPLETED"
    back = in_the_gate(slurm, three)
    fabric.pass_once(spec, schedule, slurm.states, back, set(), 0, 1020.0, 600.0)
    fabric.pass_once(spec, schedule, slurm.states, back, set(), 0, 1030.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-2"}


def test_the_gates_reservation_is_given_another_year_before_slurm_ends_it(monkeypatch):
    spec = spec_of(replicas=3, intervalSeconds=600, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    slurm.reserved = {"slonk-gpu-2"}
    nodes = [*idle("slonk-gpu-0", "slonk-gpu-1"), node("slonk-gpu-2", "idle", "DRAIN", "RESERVED")]
    slurm.ends = 1000.0 + gate.RENEW_SECONDS + 1
    fabric.pass_once(spec, fabric.Schedule(), {}, nodes, set(), 0, 1000.0, 600.0)
    assert slurm.renewed == []
    fabric.pass_once(spec, fabric.Schedule(), {}, nodes, set(), 0, 1002.0, 600.0)
    assert slurm.renewed == ["now+365days"]


def test_a_release_slurm_refuses_does_not_stop_the_passs_holds(monkeypatch):
    spec = spec_of(replicas=4, commands={"nccl": NCCL})
    slurm = Slurm(monkeypatch, bad="none")
    slurm.reserved = {"slonk-gpu-3"}
    original = slurm.reservation

    def refusing_releases(args):
        if "Nodes-=slonk-gpu-3" in args or args[0] == "delete":
            raise SlurmError("Reservation request respecification: a job uses it")
        return original(args)

    monkeypatch.setattr(slurm, "reservation", refusing_releases)
    off = spec_of(replicas=4, commands={"nccl": {**NCCL, "span": "node"}})  # nothing covered
    fabric.pass_once(off, fabric.Schedule(), {}, idle("slonk-gpu-0"), set(), 0, 1000.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-3"}
    nodes = [node("slonk-gpu-0", "down"), *idle("slonk-gpu-1", "slonk-gpu-2"),
             node("slonk-gpu-3", "idle", "RESERVED")]  # fmt: skip
    passed = fabric.Schedule(held={"slonk-gpu-3": 1.0}, passed={"nccl": {"slonk-gpu-3": 2.0}})
    fabric.pass_once(spec, passed, {}, nodes, set(), 0, 1000.0, 600.0)
    assert slurm.reserved == {"slonk-gpu-0", "slonk-gpu-3"}


def test_a_failed_runs_last_line_is_read_and_ends_its_nodes_drain_reason(monkeypatch):
    queue = (
        "5 FAILED slonk-said: busbw 12.5 GB/s, under 300\n"
        "6 COMPLETED slonk-not-here\n"
        "7 FAILED a person's words\n"
        "8 COMPLETED slonk-said: not for a run that passed\n"
    )
    monkeypatch.setattr(check_jobs.slurm_nodes, "run", lambda argv, **_: queue)
    said: dict[str, str] = {}
    states = check_jobs.states(said)
    assert states == {"5": "FAILED", "6": check_jobs.NOT_HERE, "7": "FAILED", "8": "COMPLETED"}
    assert said == {"5": "busbw 12.5 GB/s, under 300"}
    g = ["a", "b", "c"]
    runs = [
        narrowing.Run(g, False, "1", "busbw 40 GB/s"),
        narrowing.Run(g[:2], True, "2"),
        narrowing.Run(["c", "a"], False, "3", "busbw 12.5 GB/s, under 300"),
        narrowing.Run(["c", "b"], False, "4"),
    ]
    assert narrowing.blame("c", runs, "nccl-check") == (
        "nccl-check failed beside 2 nodes that pass without it (job 1, 3, 4): "
        "busbw 12.5 GB/s, under 300"
    )
