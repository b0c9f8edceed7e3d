"""Active checks (issue 32): their settings, their partition, the node's judgement of a probe's
figures, and the controller's schedule."""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import pytest

from slonk.align import active as schedule
from slonk.align import check_jobs
from slonk.config import render
from slonk.config.spec import SpecError, parse_spec
from slonk.health import active, runner
from slonk.health.probe import Unhealthy
from slonk.local import fake_gpu
from slonk.slurm import reasons
from slonk.slurm.slurm_state import NodeState

from ..support.gpu_spec import gpu_and_cpu_pools

BASE = gpu_and_cpu_pools({"active": {"enabled": True}})
H100 = "NVIDIA H100 80GB HBM3"


def spec_with(**health: object) -> object:
    doc = copy.deepcopy(BASE)
    doc["health"]["active"].update(health)  # type: ignore[index]
    return parse_spec(doc)


# Settings


def test_active_checks_are_off_unless_asked_for():
    doc = copy.deepcopy(BASE)
    del doc["health"]["active"]
    spec = parse_spec(doc)
    assert spec.health.active is None
    conf = render.render(spec)["slurm.conf"]
    assert "slonk-active" not in conf and "Preempt" not in conf


def test_only_pools_with_gpus_run_them():
    spec = parse_spec(BASE)
    assert set(spec.active_checks(spec.pool("gpu"))) == {"gpu-memory", "gpu-compute"}
    assert spec.active_checks(spec.pool("cpu")) == {}


@pytest.mark.parametrize(
    ("active", "error"),
    [
        ({"checks": {"gpu-memory": {"minimum": {H100: 0}}}}, r"minimum\.NVIDIA H100.*> 0"),
        ({"checks": {"gpu-memory": {"minimum": {"bad;name": 1}}}}, "not a GPU model"),
        ({"checks": {"gpu-memory": {"probe": "rm -rf /; x"}}}, "probe.*not a program"),
        ({"checks": {"gpu-memory": {"timeoutSeconds": 4}}}, "timeoutSeconds: must be >= 5"),
        ({"checks": {"gpu-memory": {"spreadPercent": 95}}}, "spreadPercent: must be <= 90"),
        ({"checks": {"dcgm": {}}}, r"checks\.dcgm: unknown key"),
        ({"intervalSeconds": 9}, "intervalSeconds: must be >= 10"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(active, error):
    doc = copy.deepcopy(BASE)
    doc["health"]["active"].update(active)
    with pytest.raises(SpecError, match=error):
        parse_spec(doc)


def test_a_sites_thresholds_replace_slonks():
    spec = spec_with(checks={"gpu-memory": {"minimum": {"NVIDIA H200": 4000}}})
    options = spec.health.active.checks["gpu-memory"].options
    assert options["minimum"] == {"NVIDIA H200": 4000.0}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"partitions": {"slonk-active": {"pools": ["cpu"]}}}, "the active checks' partition"),
        (
            {"partitions": {"main": {"pools": ["gpu"], "priorityTier": 0}}},
            "the active checks' tier",
        ),
        (
            {"slurmConf": {"PreemptType": "preempt/qos"}},
            "active checks need preempt/partition_prio",
        ),
    ],
)
def test_what_would_stop_users_preempting_checks_is_refused(change, error):
    doc = copy.deepcopy(BASE) | change
    with pytest.raises(SpecError, match=error):
        parse_spec(doc)


def test_the_checks_partition_is_the_lowest_tier_and_users_partitions_preempt_nothing():
    conf = render.render(parse_spec(BASE))["slurm.conf"].splitlines()
    assert "PreemptType=preempt/partition_prio" in conf
    assert "PreemptMode=CANCEL" in conf
    (main,) = [line for line in conf if line.startswith("PartitionName=main ")]
    assert main.endswith(" PreemptMode=OFF")
    (checks,) = [line for line in conf if line.startswith("PartitionName=slonk-active ")]
    assert checks.split() == [
        "PartitionName=slonk-active", "Nodes=gpu", "Default=NO", "MaxTime=3", "PriorityTier=0",
        "PreemptMode=CANCEL", "Hidden=YES", "AllowGroups=root", "State=UP",
    ]  # fmt: skip


def test_a_sites_own_preemption_keeps_its_partitions_as_they_are():
    doc = copy.deepcopy(BASE) | {"slurmConf": {"PreemptType": "preempt/partition_prio"}}
    conf = render.render(parse_spec(doc))["slurm.conf"]
    (main,) = [line for line in conf.splitlines() if line.startswith("PartitionName=main ")]
    assert "PreemptMode" not in main


def test_the_plan_runs_them_in_their_phase_and_at_boot_with_the_gate():
    plan = runner.plan_for(parse_spec(BASE), "slonk-gpu-0")
    memory = plan.checks["active:gpu-memory"]
    assert memory["phases"] == ["active", "boot"]
    assert memory["options"]["measure"] == "memory" and memory["options"]["unit"] == "GB/s"
    ungated = runner.plan_for(spec_with(gate=False), "slonk-gpu-0")
    assert ungated.checks["active:gpu-compute"]["phases"] == ["active"]
    assert not any(
        n.startswith("active:") for n in runner.plan_for(parse_spec(BASE), "slonk-cpu-0").checks
    )


# Reasons


def test_an_active_drain_is_a_health_drain_named_for_its_check():
    reason = reasons.health("active:gpu-memory", "GPU 1 1210 GB/s")
    assert reason == "slonk:active:gpu-memory: GPU 1 1210 GB/s"
    assert reasons.classify(reason) == reasons.Cause(reasons.HEALTH, "active:gpu-memory")
    assert reasons.classify("slonk:active:gpu-memory:x") is None  # a person's
    with pytest.raises(ValueError):
        reasons.health("active", "a passive check may not take the word")
    with pytest.raises(ValueError):
        reasons.health("active:Bad Name", "x")


# The node's judgement


def figures(*values: float, name: str = H100) -> str:
    return "\n".join(
        json.dumps({"index": i, "name": name, "value": v, "unit": "GB/s"})
        for i, v in enumerate(values)
    )


OPTIONS = {"minimum": {H100: 2700.0}, "spreadPercent": 15, "measure": "memory", "unit": "GB/s"}


@pytest.mark.parametrize(
    ("values", "name", "problem"),
    [
        ((3025, 3026), H100, None),
        ((3025, 1210), H100, "GPU 1 1210 GB/s, under 2700 for NVIDIA H100 80GB HBM3"),
        ((4000, 3000), "NVIDIA H200", "GPU 1 3000 GB/s, more than 15% under the best here (4000)"),
        ((4000, 3500), "NVIDIA H200", None),  # no threshold for the model: within the spread
    ],
)
def test_a_gpu_fails_under_its_models_minimum_or_far_under_its_nodes_best(values, name, problem):
    found = active.judge(active.parse(figures(*values, name=name), "GB/s"), OPTIONS, "GB/s")
    assert found == ([problem] if problem else [])


@pytest.mark.parametrize(
    "output",
    ['{"index": 0, "name": "x"}', '{"index": "a", "name": "x", "value": 1, "unit": "GB/s"}',
     '{"index": 0, "name": "x", "value": 1, "unit": "TFLOP/s"}'],
)  # fmt: skip
def test_a_probe_line_in_the_wrong_shape_fails_the_check(output):
    with pytest.raises(Unhealthy):
        active.parse(output, "GB/s")


def probe_script(tmp_path: Path, body: str, name: str = "probe") -> str:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_the_check_runs_its_probe_and_says_the_figures(tmp_path):
    probe = probe_script(tmp_path, f"echo 'driver warning'; echo '{figures(3025, 3026)}'")
    assert active.check({**OPTIONS, "probe": probe}, 2, 5) == "memory 3025, 3026 GB/s"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            "echo 'cuInit failed: CUDA_ERROR_NO_DEVICE' >&2; exit 1",
            r"memory probe failed \(1\): cuInit failed",
        ),
        (f"echo '{figures(3025)}'", "measured 1 of 2 GPUs"),
        ("true", "measured 0 of 2 GPUs"),
    ],
)
def test_a_probe_that_fails_or_misses_a_gpu_fails_the_check(tmp_path, body, said):
    with pytest.raises(Unhealthy, match=said):
        active.check({**OPTIONS, "probe": probe_script(tmp_path, body)}, 2, 5)


def test_the_fake_probe_measures_a_healthy_h100_and_its_faults(tmp_path, monkeypatch, capsys):
    state = tmp_path / "scenario"
    monkeypatch.setattr(fake_gpu, "SCENARIO_FILE", str(state))
    assert fake_gpu.main(["probe", "compute"]) == 0
    healthy = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["value"] for r in healthy] == [57.8, 58.8]
    state.write_text("slow-compute\n")
    fake_gpu.main(["probe", "compute"])
    assert [json.loads(line)["value"] for line in capsys.readouterr().out.splitlines()] == [
        57.8,
        21.5,
    ]
    assert fake_gpu.main(["probe", "bogus"]) == 2


# The controller's schedule


def node(
    name: str, state: str = "idle", flags: frozenset[str] = frozenset(), started: str = "100"
) -> NodeState:
    return NodeState(name, state, flags, "", slurmd_started=started)


def test_due_nodes_are_the_quiet_ones_unchecked_longest():
    spec = spec_with(intervalSeconds=600)
    plan = schedule.Schedule(ran={"slonk-gpu-0": 1000.0}, tried={})
    nodes = [
        node("slonk-gpu-0"),
        node("slonk-gpu-1"),
        node("slonk-cpu-0"),  # no GPUs: no checks
    ]
    assert schedule.due(spec, nodes, plan, 1700.0) == ["slonk-gpu-1", "slonk-gpu-0"]
    assert schedule.due(spec, nodes, plan, 1500.0) == ["slonk-gpu-1"]  # gpu-0 ran at 1000
    busy = [node("slonk-gpu-0", "allocated"), node("slonk-gpu-1", flags=frozenset({"DRAIN"}))]
    assert schedule.due(spec, busy, plan, 5000.0) == []


def test_a_new_pods_gate_counts_as_a_run_and_a_preempted_check_waits():
    spec = spec_with(intervalSeconds=600)
    plan = schedule.Schedule()
    assert schedule.due(spec, [node("slonk-gpu-0", started="1000")], plan, 1500.0) == []
    assert schedule.due(
        spec_with(intervalSeconds=600, gate=False),
        [node("slonk-gpu-0", started="1000")],
        plan,
        1500.0,
    ) == ["slonk-gpu-0"]
    plan.jobs = {"7": "slonk-gpu-1", "8": "slonk-gpu-0"}
    schedule.settle(plan, {"7": "PREEMPTED", "8": "RUNNING"}, 2000.0, [])
    assert plan.jobs == {"8": "slonk-gpu-0"} and plan.tried == {"slonk-gpu-1": 2000.0}
    assert (
        schedule.due(spec, [node("slonk-gpu-1")], plan, 2000.0 + schedule.RETRY_SECONDS - 1) == []
    )
    schedule.settle(plan, {}, 2100.0, [])  # ended and gone from the queue: it ran
    assert plan.ran == {"slonk-gpu-0": 2100.0}


@pytest.mark.parametrize(("per_minute", "most"), [(6, 1), (5, 1), (7, 2), (60, 11)])
def test_starts_are_spread_at_the_rate_asked(per_minute, most):
    plan = schedule.Schedule()
    counts = []
    for second in range(0, 600, 10):  # ten minutes of passes
        counts.append(schedule.allowance(plan, per_minute, 1000.0 + second))
        plan.tokens -= counts[-1]
    assert per_minute * 10 - 1 <= sum(counts) <= per_minute * 10 and max(counts) <= most


def test_the_rate_holds_across_a_reload_of_the_schedule(tmp_path, monkeypatch):
    """With a backup controller the schedule is read again each pass: its bucket too."""
    monkeypatch.setattr(schedule.Schedule, "path", tmp_path / "slonk-active.json")
    counts = []
    for second in range(0, 600, 10):
        plan = schedule.Schedule.load()
        counts.append(schedule.allowance(plan, 2, 1000.0 + second))
        plan.tokens -= counts[-1]
        plan.save()
    assert sum(counts) in (19, 20)


def test_active_checks_run_one_after_another(monkeypatch):
    plan = runner.plan_for(parse_spec(BASE), "slonk-gpu-0")
    spans = {}

    def slow(name):
        def run(node, options, phase, timeout):
            started = time.monotonic()
            time.sleep(0.2)
            spans[name] = (started, time.monotonic())
            return "ok"

        return run

    monkeypatch.setattr(runner, "find", slow)
    results = runner.run_phase(plan, ["active:gpu-memory", "active:gpu-compute"], "active")
    assert [r.check for r in results] == ["active:gpu-memory", "active:gpu-compute"]
    (first, second) = sorted(spans.values())
    assert second[0] >= first[1]  # the second began once the first had ended


def test_a_check_still_queued_after_the_backfill_schedulers_turns_is_cancelled_and_waits(
    monkeypatch,
):
    """Users' jobs waiting in a partition of a higher tier keep Slurm's main scheduler off
    the checks' partition: only the backfill scheduler starts a check (25 s after submission,
    measured in local mode beside such a job). Queued longer, its node was taken."""
    cancelled = []
    monkeypatch.setattr(schedule.slurm_nodes, "run", lambda argv, **_: cancelled.append(argv))
    plan = schedule.Schedule(jobs={"9": "slonk-gpu-0"}, queued={"9": 3000.0})
    idle = [node("slonk-gpu-0")]
    schedule.settle(plan, {"9": "PENDING"}, 3000.0 + check_jobs.QUEUED_SECONDS - 1, idle)
    assert cancelled == [] and plan.jobs == {"9": "slonk-gpu-0"}
    schedule.settle(plan, {"9": "PENDING"}, 3000.0 + check_jobs.QUEUED_SECONDS, idle)
    assert cancelled == [["scancel", "9"]]
    assert plan.jobs == {} and plan.queued == {} and plan.ran == {}
    assert plan.tried == {"slonk-gpu-0": 3000.0 + check_jobs.QUEUED_SECONDS}


@pytest.mark.parametrize(
    "state",
    [
        node("slonk-gpu-0", "allocated"),  # a user's job took it
        node("slonk-gpu-0", flags=frozenset({"DRAIN"})),
        node(
            "slonk-gpu-0", flags=frozenset({"POWERED_DOWN"})
        ),  # lent: started, it would call it back
        node("slonk-gpu-0", flags=frozenset({"RESERVED"})),  # held by the block checks' gate
    ],
)
def test_a_queued_check_whose_node_is_no_longer_idle_is_cancelled_at_once(monkeypatch, state):
    cancelled = []
    monkeypatch.setattr(schedule.slurm_nodes, "run", lambda argv, **_: cancelled.append(argv))
    plan = schedule.Schedule(jobs={"9": "slonk-gpu-0"}, queued={"9": 3000.0})
    schedule.settle(plan, {"9": "PENDING"}, 3010.0, [state])
    assert cancelled == [["scancel", "9"]] and plan.tried == {"slonk-gpu-0": 3010.0}


def test_a_check_job_takes_the_whole_node_in_its_partition():
    argv = schedule.submit_argv(parse_spec(BASE), "slonk-gpu-1")
    assert argv[:2] == ["sbatch", "--parsable"]
    for word in ("--partition=slonk-active", "--nodelist=slonk-gpu-1",
                 "--exclusive", "--mem=0", "--gres=gpu:2", "--time=3"):  # fmt: skip
        assert word in argv
    assert argv[-1] == f"--wrap={schedule.COMMAND}"
    assert "--chdir=/" in argv  # never the agent's directory, nor /tmp where that is missing


def test_the_fake_is_importable_as_the_pods_run_it():
    assert "probe" in (fake_gpu.__doc__ or "") and sys.modules["slonk.local.fake_gpu"]


# A site's own commands

DIAG = {"command": "dcgmi diag -r 2", "timeoutSeconds": 900}


def test_a_sites_command_runs_beside_slonks_checks_in_their_phases():
    spec = spec_with(commands={"dcgm": DIAG, "burn": {**DIAG, "enabled": False}})
    assert set(spec.active_checks(spec.pool("gpu"))) == {"gpu-memory", "gpu-compute", "dcgm"}
    assert spec.active_checks(spec.pool("cpu")) == {}
    planned = runner.plan_for(spec, "slonk-gpu-0").checks["active:dcgm"]
    assert planned["phases"] == ["active", "boot"]
    assert planned["timeoutSeconds"] == 900
    assert planned["options"] == {"command": "dcgmi diag -r 2", "span": "node"}
    # Its job's time limit holds every check of the node: 60 + 60 + 900 s, and a minute.
    assert "--time=18" in schedule.submit_argv(spec, "slonk-gpu-1")


@pytest.mark.parametrize(
    ("commands", "error"),
    [
        ({"Bad_Name": DIAG}, r"commands\.Bad_Name: a check's name is a word"),
        ({"gpu-memory": DIAG}, r"commands\.gpu-memory: gpu-memory is slonk's own check"),
        ({"dcgm": {"timeoutSeconds": 60}}, r"commands\.dcgm\.command: required"),
        ({"dcgm": {"command": "dcgmi diag"}}, r"commands\.dcgm\.timeoutSeconds: required"),
        ({"dcgm": {**DIAG, "command": "dcgmi diag; reboot"}}, "command.*not a program"),
        ({"dcgm": {**DIAG, "command": "-rf /"}}, "command.*not a program"),
        # A path relative to where the check runs: its job may start in /tmp, users' to write.
        ({"dcgm": {**DIAG, "command": "bin/diag -r 1"}}, "command.*not a program"),
        ({"dcgm": {**DIAG, "command": "./diag"}}, "command.*not a program"),
        ({"dcgm": {**DIAG, "command": 7}}, r"commands\.dcgm\.command: expected a string"),
        ({"dcgm": {"enabled": False}}, r"commands\.dcgm\.command: required"),
        ({"x-": DIAG}, r"commands\.x-: a check's name"),
        ({"dcgm": {**DIAG, "timeoutSeconds": 3601}}, "timeoutSeconds: must be <= 3600"),
        ({"dcgm": {**DIAG, "shell": True}}, r"commands\.dcgm\.shell: unknown key"),
        ({"dcgm": "dcgmi diag"}, r"commands\.dcgm: expected a mapping"),
        ({f"c{i}": DIAG for i in range(9)}, "commands: at most 8 checks"),
        # Into every node's health plan and log lines: bounded, and the error does not repeat it.
        (
            {"dcgm": {**DIAG, "command": "dcgmi " + "x" * 507}},
            r"command: a program and its options of at most 512 characters, not 513$",
        ),
    ],
)
def test_a_bad_command_is_refused_naming_the_key(commands, error):
    with pytest.raises(SpecError, match=error):
        spec_with(commands=commands)


def test_a_command_line_of_the_longest_length_is_taken():
    command = "dcgmi " + "x" * 506
    spec = spec_with(commands={"dcgm": {**DIAG, "command": command}})
    assert spec.active_checks(spec.pool("gpu"))["dcgm"].options["command"] == command


def program(tmp_path: Path, body: str) -> str:
    return probe_script(tmp_path, body, "diag")


def test_a_command_passes_by_exiting_0_and_fails_with_its_last_words(tmp_path):
    ok = program(tmp_path, "echo 'all tests: Pass'; printf '\\377 stray bytes\\n'")
    assert (
        active.run_command({"command": ok}, 5) == "diag passed: all tests: Pass \ufffd stray bytes"
    )
    failing = program(tmp_path, "echo 'GPU 0: Pass'; echo 'GPU 1: Memory: Fail'; exit 226")
    with pytest.raises(Unhealthy, match=r"diag exited with 226: GPU 0: Pass GPU 1: Memory: Fail$"):
        active.run_command({"command": failing}, 5)
    hung = program(tmp_path, "sleep 30")
    with pytest.raises(Unhealthy):
        active.run_command({"command": hung}, 0.5)
    killed = program(tmp_path, "kill -9 $$")
    with pytest.raises(Unhealthy, match=r"^diag was killed by signal 9: no output$"):
        active.run_command({"command": killed}, 5)


def test_the_verdict_of_a_long_output_stays_in_the_drain_reason(tmp_path):
    chatty = program(tmp_path, "seq 1 5000; echo FINAL: GPU 3 FAIL; exit 1")
    with pytest.raises(Unhealthy) as caught:
        active.run_command({"command": chatty}, 5)
    reason = reasons.health(f"active:{'n' * 32}", str(caught.value))
    assert reason.endswith("FINAL: GPU 3 FAIL"), reason


def test_a_node_without_the_program_does_not_run_it(tmp_path):
    """The check does not apply there: it passes, saying so (a drain it made is lifted)."""
    said = active.run_command({"command": "slonk-no-such-diag -r 2"}, 5)
    assert said == "not run: slonk-no-such-diag is not on this node"
    assert active.run_command({"command": str(tmp_path / "nosuch")}, 5).startswith("not run: ")
