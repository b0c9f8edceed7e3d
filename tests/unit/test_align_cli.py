"""`slonk align`'s table and `slonk pool scale`'s refusals, without a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slonk.align import lending, pool, report, topology
from slonk.align import plan as p
from slonk.config.spec import SpecError, parse_spec
from slonk.slurm import reasons
from slonk.slurm.slurm_state import NodeState


def test_the_table_shows_both_sides_and_the_drift_on_one_line_each() -> None:
    cause = p.Cause("goal", "drain: RMA\nState=RESUME")
    drain = p.Action("slonk-cpu-0", "drain", cause.reason)
    row = p.Row(
        "slonk-cpu-0", "Running", "local-slonk-cpu-0", (cause,), True, "idle", "", 0, (drain,)
    )
    calm = p.Row("slonk-cpu-1", "Running", "local-slonk-cpu-1", (), False, "idle", "", 2, ())
    text = report.table(p.Plan((drain,), (), (row, calm), {}))
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].split()[:2] == ["NODE", "POD"]
    assert "drain slonk:k8s:goal: drain: RMA State=RESUME" in lines[1]
    assert "(not all known)" in lines[2] and lines[2].rstrip().endswith("-")


def test_lending_targets_are_read_carefully(tmp_path: Path) -> None:
    path = tmp_path / "lending.json"
    assert lending.targets(path) == {}
    path.write_text(json.dumps({"gpu": 1, "cpu": -1, "x": "2", "y": True}))
    assert lending.targets(path) == {"gpu": 1}
    lending.set_target("cpu", 0, path)
    lending.set_target("gpu", None, path)
    assert lending.targets(path) == {"cpu": 0}
    path.write_text("[1]")
    assert lending.targets(path) == {}


@pytest.mark.parametrize(
    ("pool_name", "replicas", "said"),
    [
        ("nope", 1, "no pool 'nope'"),
        ("cpu", 3, "scale it between 0 and 2"),
        ("cpu", -1, "scale it between 0 and 2"),
    ],
)
def test_pool_scale_refuses_what_slurm_has_no_nodes_for(
    demo_spec: dict, pool_name: str, replicas: int, said: str
) -> None:
    with pytest.raises(SpecError, match=said):
        pool.scale(parse_spec(demo_spec), pool_name, replicas, timeout=None)


def test_a_k8s_reason_reads_back_as_the_syncers() -> None:
    node = NodeState("n", "idle", frozenset({"DRAIN"}), reasons.k8s("lent", "x"))
    assert node.cause == reasons.Cause(reasons.K8S, "lent")


def test_a_topology_slurmctld_cannot_take_yet_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_spec: dict
) -> None:
    from slonk.config import placement
    from slonk.pod import config_watch

    saved = tmp_path / "placement.json"
    monkeypatch.setattr(placement.paths, "PLACEMENT", saved)
    monkeypatch.setattr(placement.load, "__defaults__", (saved,))
    monkeypatch.setattr(placement.save, "__defaults__", (saved,))
    calls: list[str] = []

    def not_now(self: object, spec: object) -> str:
        calls.append("apply")
        raise config_watch.NotNow("slurmctld is not answering")

    monkeypatch.setattr(config_watch.Controller, "apply", not_now)
    spec = parse_spec(demo_spec)
    found = {"slonk-gpu-0": {"block": "nvl1"}}
    said = topology.place(found, spec)
    assert said and "waits for slurmctld" in said[0]
    assert placement.load(saved) == {}, "kept as a change still to make"
    topology.place(found, spec)
    assert calls == ["apply", "apply"]
