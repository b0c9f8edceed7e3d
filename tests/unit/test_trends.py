"""Trend rules (issue 32, part 3): a GPU counter rising too fast drains its node
`slonk:trend:<rule>`, within a blast-radius limit of their own, and the drain waits for a
person: no pass lifts it, no recycle replaces the pod."""

from __future__ import annotations

import copy
import json
import os
import time

import pytest

from slonk.align import recycle
from slonk.config.model import RecycleSettings
from slonk.config.spec import SpecError, parse_spec
from slonk.health import drains, runner, trend
from slonk.health.probe import Unhealthy
from slonk.health.runner import Result
from slonk.slurm.slurm_state import NodeState

from ..support.gpu_spec import gpu_and_cpu_pools

BASE = gpu_and_cpu_pools({"trends": {"enabled": True}})
REASON = (
    "slonk:trend:ecc-corrected: GPU 1 (00000000:2A:00.0): ecc.errors.corrected.aggregate.total "
    "rose by more than 1000 within 86400 s"
)


def test_trends_are_off_unless_asked_for_and_run_beside_the_gpu_check():
    doc = copy.deepcopy(BASE)
    del doc["health"]["trends"]
    assert parse_spec(doc).health.trends is None
    spec = parse_spec(BASE)
    plan = runner.plan_for(spec, "slonk-gpu-0")
    planned = plan.checks["trend:ecc-corrected"]
    assert planned["phases"] == ["watch"]
    assert planned["options"]["field"] == "ecc.errors.corrected.aggregate.total"
    assert plan.trend_drained_percent == 5
    cpu = runner.plan_for(spec, "slonk-cpu-0")
    assert not any(name.startswith("trend:") for name in cpu.checks)


def test_each_rule_reads_its_counter_from_the_program_that_has_it():
    plan = runner.plan_for(parse_spec(BASE), "slonk-gpu-0")
    gpu = plan.checks["gpu"]["options"]
    assert plan.checks["trend:ecc-corrected"]["options"]["command"] == gpu["nvidiaSmi"]
    nvlink = plan.checks["trend:nvlink-crc"]["options"]
    assert nvlink["field"] == "nvlink.errors.crc.total"
    assert nvlink["command"] == gpu["nvml"] == "/opt/slonk/bin/python3 -I -m slonk.health.nvml"
    # A site that empties the reader has no rule on its counters (nothing could read them).
    doc = copy.deepcopy(BASE)
    doc["health"]["checks"] = {"gpu": {"nvml": ""}}
    plan = runner.plan_for(parse_spec(doc), "slonk-gpu-0")
    assert "trend:nvlink-crc" not in plan.checks and "trend:ecc-corrected" in plan.checks


@pytest.mark.parametrize(
    ("rules", "error"),
    [
        ({"ecc-corrected": {"maxIncrease": -1}}, "maxIncrease: must be >= 0"),
        ({"ecc-corrected": {"windowSeconds": 30}}, "windowSeconds: must be >= 60"),
        ({"nvlink-replay": {}}, r"rules\.nvlink-replay: unknown key"),
    ],
)
def test_bad_rules_are_refused_naming_the_key(rules, error):
    doc = copy.deepcopy(BASE)
    doc["health"]["trends"]["rules"] = rules
    with pytest.raises(SpecError, match=error):
        parse_spec(doc)


@pytest.mark.parametrize(
    ("values", "rise"),
    [
        ([5, 5, 5], 0),
        ([5, 100, 1600], 1595),
        ([900, 1000, 3, 40], 37),  # reset to 3 (the driver reloaded): counted from there
    ],
)
def test_a_gpus_rise_counts_from_its_last_reset(values, rise):
    samples = [(float(t), {"1": v}) for t, v in enumerate(values)]
    assert trend.increases(samples) == {"1": rise}


def fake_smi(tmp_path, counts: dict[str, object]) -> str:
    script = tmp_path / "smi"
    rows = "\\n".join(f"{i}, 0000:{i}A:00.0, {n}" for i, n in counts.items())
    script.write_text(f'#!/bin/sh\nprintf "{rows}\\n"\n')
    script.chmod(0o755)
    return str(script)


def options(smi: str, most: int = 1000, window: int = 3600) -> dict:
    return {
        "rule": "ecc-corrected",
        "field": "ecc.errors.corrected.aggregate.total",
        "maxIncrease": most,
        "windowSeconds": window,
        "command": smi,
    }


def test_the_rule_keeps_its_window_and_fails_a_gpu_rising_too_fast(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    assert trend.check(options(fake_smi(tmp_path, {"0": 4, "1": 10})), 5, state).startswith(
        "ecc.errors.corrected.aggregate.total +0"
    )
    trend.check(options(fake_smi(tmp_path, {"0": 4, "1": 900})), 5, state)
    said = (
        r"GPU 1 \(0000:1A:00\.0\): ecc\.errors\.corrected\.aggregate\.total "
        r"rose by more than 1000 within 3600 s"
    )
    with pytest.raises(Unhealthy, match=f"^{said}$"):
        trend.check(options(fake_smi(tmp_path, {"0": 5, "1": 1500})), 5, state)
    kept = json.loads((state / "trend-ecc-corrected.json").read_text())
    assert len(kept) == 1  # a sample kept per window / MAX_SAMPLES: every watch judged
    with pytest.raises(Unhealthy, match=f"^{said}$"):  # the same words while the rise holds
        trend.check(options(fake_smi(tmp_path, {"0": 5, "1": 1700})), 5, state)


@pytest.fixture(autouse=True)
def fresh_samples():
    trend._KEPT.clear()
    yield
    trend._KEPT.clear()


def test_a_full_disk_or_a_failing_nvidia_smi_gives_no_result_never_a_drain(tmp_path, monkeypatch):
    from slonk.health import checks
    from slonk.health.probe import Inconclusive

    state = tmp_path / "state"
    state.mkdir()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trend, "write_atomically", full)
    assert "+0" in trend.check(options(fake_smi(tmp_path, {"1": 7})), 5, state)
    broken = tmp_path / "broken"
    broken.write_text(
        "#!/bin/sh\necho 'Unable to determine the device handle for GPU 1'\nexit 15\n"
    )
    broken.chmod(0o755)
    with pytest.raises(Inconclusive, match="cannot read"):
        checks.check_trend(checks.Node("n1", 2, ()), options(str(broken)), "watch", 5)
    monkeypatch.setattr(trend, "check", lambda *a: 1 / 0)
    with pytest.raises(Inconclusive, match="ZeroDivisionError"):
        checks.check_trend(checks.Node("n1", 2, ()), options(str(broken)), "watch", 5)


def test_a_gpu_that_drops_shifts_no_count_onto_another(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    smi = tmp_path / "smi"
    smi.write_text("#!/bin/sh\nprintf '0, 0000:1A:00.0, 10\\n1, 0000:2A:00.0, 5000\\n'\n")
    smi.chmod(0o755)
    trend.check(options(str(smi)), 5, state)
    smi.write_text("#!/bin/sh\nprintf '0, 0000:2A:00.0, 5000\\n'\n")  # GPU 0 gone
    assert "+0" in trend.check(options(str(smi)), 5, state)


def test_a_count_that_is_no_ascii_number_is_not_counted(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    said = trend.check(options(fake_smi(tmp_path, {"0": "\u00b2", "1": "[N/A]"})), 5, state)
    assert said == "ecc.errors.corrected.aggregate.total not counted by these GPUs"


def test_samples_older_than_the_window_are_forgotten(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    old = time.time() - 7200
    (state / "trend-ecc-corrected.json").write_text(json.dumps([[old, {"1": 0}]]))
    said = trend.check(options(fake_smi(tmp_path, {"1": 5000}), window=3600), 5, state)
    assert "+0" in said  # the 5,000 rose before this window


def test_a_hostile_samples_file_only_restarts_the_window(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "trend-ecc-corrected.json").write_text('[["x", 1], {"a": []}]')
    assert "+0" in trend.check(options(fake_smi(tmp_path, {"1": 7})), 5, state)


def node(reason: str, state: str = "idle") -> NodeState:
    return NodeState("n1", state, frozenset({"DRAIN"}), reason, slurmd_started="1")


def test_a_trend_drain_is_never_lifted_or_replaced_by_a_check():
    drained = node(REASON)
    passing = [Result("trend:ecc-corrected", True, "+0", 0.1), Result("gpu", True, "ok", 0.1)]
    assert drains.decide(drained, passing, undrain=True) is None
    failing = [Result("storage", False, "/home is not mounted", 0.1)]
    assert drains.decide(drained, failing, undrain=True) is None
    # Not drained yet: the failing rule drains.
    fresh = NodeState("n1", "idle", frozenset(), "", slurmd_started="1")
    bad = [Result("trend:ecc-corrected", False, "GPU 1 ... +1500", 0.1)]
    assert drains.decide(fresh, bad, undrain=True) == (
        "drain",
        "slonk:trend:ecc-corrected: GPU 1 ... +1500",
    )


def test_without_the_gate_an_active_drain_is_left_for_a_person():
    history = recycle.History()
    settings = RecycleSettings(idle_seconds=1)
    reason = "slonk:active:gpu-memory: GPU 1 1210 GB/s, under 2700"
    nodes = [node(reason)]
    assert list(recycle.due(nodes, history, settings, 100.0, gate=False)) == []
    assert list(recycle.due(nodes, history, settings, 200.0, gate=False)) == []
    assert history.left == {"n1": reason}
    gated = recycle.History()
    list(recycle.due(nodes, gated, settings, 100.0))
    assert [a for a, _, _ in recycle.due(nodes, gated, settings, 200.0)] == ["recycle"]


def test_the_recycle_loop_leaves_a_trend_drain_for_a_person():
    history = recycle.History()
    settings = RecycleSettings(idle_seconds=1)
    nodes = [node(REASON)]
    assert list(recycle.due(nodes, history, settings, 100.0)) == []
    assert list(recycle.due(nodes, history, settings, 200.0)) == []
    assert history.left == {"n1": REASON}


def test_the_fake_gpus_counter_rises_from_its_scenarios_writing(tmp_path, monkeypatch, capsys):
    from slonk.local import fake_gpu

    state = tmp_path / "scenario"
    state.write_text("rising\n")
    os.utime(state, (time.time() - 10, time.time() - 10))
    monkeypatch.setattr(fake_gpu, "SCENARIO_FILE", str(state))
    query = "--query-gpu=index,ecc.errors.corrected.aggregate.total"
    assert fake_gpu.main(["nvidia-smi", query, fake_gpu.FORMAT]) == 0
    rows = dict(line.split(", ") for line in capsys.readouterr().out.splitlines())
    assert rows["0"] == "0" and 190 <= int(rows["1"]) <= 260
