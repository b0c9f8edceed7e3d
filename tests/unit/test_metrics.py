"""The metrics exporter (slonk.metrics) on Slurm 24.11's own JSON (tests/unit/data), hostile
input, a failing source, and promtool's verdict on what it serves."""

from __future__ import annotations

import copy
import errno
import json
import shutil
import subprocess
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slonk.agent.changes import Changes
from slonk.config.health_checks import HEALTH_CHECKS
from slonk.config.spec import SpecError, parse_spec
from slonk.health import history, runner
from slonk.health.checks import Node
from slonk.metrics import CAUSES, cause_label
from slonk.metrics.cluster import NODE_STATES, job_families, node_families
from slonk.metrics.collector import SourcesCollector
from slonk.metrics.events import EventCounter, syncer_families
from slonk.metrics.family import Family, RecordError
from slonk.metrics.health import health_families
from slonk.metrics.sdiag import sdiag_families
from slonk.metrics.sources import Spec
from slonk.pod_agent import tasks_for
from slonk.slurm.slurm_state import SlurmError

from .slurm_json import document, node, nodes, text

POOLS = {"bare": "cpu", "n1": "cpu", "n2": "gpu", "n3": "gpu"}  # n4: no pool


def pool_of(node: str) -> str:
    return POOLS.get(node, "")


def samples(families: list[Family], name: str) -> dict[tuple[str, ...], float]:
    (found,) = [f for f in families if f.name == name]
    return {labels: value for labels, value in found.samples.items() if value}


def jobs_document(*records: dict) -> str:
    shown = document("squeue.json")
    shown["jobs"] = list(records)
    return json.dumps(shown)


def job(job_id: int, state: str, partition: str = "main", reason: str = "None") -> dict:
    """A job record: the real pending job 2 of squeue.json, changed."""
    (record,) = [j for j in document("squeue.json")["jobs"] if j["job_id"] == 2]
    record = copy.deepcopy(record)
    record.update(job_id=job_id, job_state=[state], partition=partition, state_reason=reason)
    return record


# The cause label


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("", "none"),
        ("slonk:gpu: 1 of 2 GPUs answer", "gpu"),
        ("slonk:storage: /home is read-only", "storage"),
        ("slonk:newcheck: from a later slonk", "other-check"),
        ("slonk:hook:prolog:10-setup: exit 1", "hook"),
        ("slonk:prolog:10-setup: exit 1", "hook"),  # before hooks had their word
        ("slonk:quarantine: recycled 3 times", "quarantine"),
        ("slonk:pod: stopping", "pod"),
        ("slonk:scale-down: removed", "scale-down"),
        ("slonk:k8s:cordoned: by kubectl", "k8s"),
        ("maintenance by a person", "human"),
        ("slonk:gpu:no space", "human"),  # not how slonk writes a check's reason
    ],
)
def test_cause_label(reason, cause):
    assert cause_label(reason) == cause


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ('slonk:gpu"} 1\nslonk_nodes{cause="x": y', "human"),
        ("slonk:k8s:" + "a" * 100_000 + ": y", "k8s"),  # a word, but never the label
        ("slonk:" + "\u2028" * 1000, "human"),
        ("slonk:k8s:evil label: y", "human"),
        ("\x00slonk:gpu: y", "human"),
        ("x" * 1_000_000, "human"),
    ],
)
def test_no_reason_makes_a_label_of_its_own(reason, cause):
    assert cause_label(reason) == cause


def test_causes_are_the_checks_and_slonks_kinds():
    assert set(HEALTH_CHECKS) < CAUSES
    assert CAUSES - set(HEALTH_CHECKS) == {
        "none", "other-check", "human", "hook", "quarantine", "pod", "scale-down", "k8s",
        "active:gpu-memory", "active:gpu-compute", "trend:ecc-corrected", "trend:remapped-rows",
        "trend:nvlink-crc",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("slonk:active:gpu-memory: GPU 1 1210 GB/s, under 2700", "active:gpu-memory"),
        ("slonk:active:dcgm: not ours", "other-check"),
        ("slonk:active:gpu-memory:x", "human"),  # no check's reason: not slonk's
        ("slonk:none: a check named like a label", "other-check"),
    ],
)
def test_an_active_checks_drain_is_labelled_by_its_check(reason, cause):
    assert cause_label(reason) == cause


# Nodes


def test_nodes_from_slurms_json():
    families = node_families(text("scontrol-show-node.json"), lambda n: POOLS.get(n, ""))
    assert samples(families, "slonk_nodes") == {
        ("cpu", "drained", "gpu"): 1,  # bare: slonk's GPU drain
        ("cpu", "draining", "human"): 1,  # n1: a job runs; a hostile person's reason
        ("gpu", "down", "human"): 1,  # n2
        ("gpu", "unknown", "none"): 1,  # n3: never registered
        ("", "idle", "none"): 1,  # n4
    }
    assert samples(families, "slonk_cpus") == {
        ("cpu", "allocated"): 1,  # n1's job
        ("cpu", "unavailable"): 3,  # both drained
        ("gpu", "unavailable"): 4,
        ("", "idle"): 2,
    }
    assert samples(families, "slonk_memory_bytes")[("", "idle")] == 1024 * 1024 * 1024
    # every pool shows the three states, 0 or not
    cpus = next(f for f in families if f.name == "slonk_cpus")
    assert len(cpus.samples) == 3 * 3


def test_power_saving_states():
    families = node_families(text("scontrol-show-node-power.json"), lambda n: "cpu")
    assert samples(families, "slonk_nodes") == {
        ("cpu", "powering_down", "k8s"): 1,  # asked: drained, going
        ("cpu", "powering_down", "none"): 1,  # going: Slurm lifted the drain
        ("cpu", "powered_down", "k8s"): 1,  # lent
        ("cpu", "powered_down", "none"): 1,  # on-demand: its old reason is not a cause
        ("cpu", "powering_up", "none"): 1,  # waking
    }


def test_node_states_are_the_contracts():
    assert set(NODE_STATES) == {
        "idle", "mixed", "allocated", "draining", "drained", "down", "powered_down",
        "powering_up", "powering_down", "unknown",
    }  # fmt: skip


def test_gpus_from_tres():
    busy = node("g0", ["MIXED"])
    busy.update(tres="cpu=64,mem=500G,gres/gpu=8,gres/gpu:h100=8", tres_used="cpu=8,gres/gpu=3")
    sick = node("g1", ["IDLE", "DRAIN"], "slonk:gpu: 7 of 8 GPUs answer")
    sick.update(tres="cpu=64,gres/gpu=8")
    families = node_families(nodes(busy, sick), lambda n: "gpu")
    assert samples(families, "slonk_gpus") == {
        ("gpu", "allocated"): 3,
        ("gpu", "idle"): 5,
        ("gpu", "unavailable"): 8,
    }


def test_hostile_and_broken_node_fields_count_nothing():
    odd = node("odd", ["IDLE"])
    odd.update(
        cpus="64", alloc_cpus=True, real_memory=10**30, alloc_memory=-5,
        tres="gres/gpu=99999999999999999999,gres/gpu=x", tres_used=["gres/gpu=1"],
    )  # fmt: skip
    families = node_families(nodes(odd), lambda n: "")
    assert samples(families, "slonk_nodes") == {("", "idle", "none"): 1}
    for name in ("slonk_cpus", "slonk_memory_bytes", "slonk_gpus"):
        assert samples(families, name) == {}


@pytest.mark.parametrize(
    "broken",
    [
        "not json",
        json.dumps({"nodes": "all of them"}),
        json.dumps({"nodes": [{"name": "n"}], "errors": []}),  # no state
        json.dumps({"nodes": [], "errors": [{"description": "Unable to contact slurmctld"}]}),
    ],
)
def test_broken_node_documents_fail_the_source(broken):
    with pytest.raises(SlurmError):
        node_families(broken, lambda n: "")


# Jobs


def test_jobs_from_slurms_json():
    families = job_families(text("squeue.json"), {"main", "gpu"}, pool_of)
    assert samples(families, "slonk_jobs") == {("main", "running"): 1, ("main", "pending"): 1}
    assert samples(families, "slonk_jobs_pending") == {("main", "ReqNodeNotAvail"): 1}
    jobs = next(f for f in families if f.name == "slonk_jobs")
    assert jobs.samples[("gpu", "pending")] == 0  # an empty partition reads 0, not absent


def test_job_labels_are_bounded():
    queue = jobs_document(
        job(3, "PENDING", "main,gpu", "Priority"),  # in both partitions, counted in each
        job(4, "PENDING", 'main"} 1\nslonk_jobs{x="', 'Bad reason"} 1'),
        job(5, "PENDING", "nosuch", "A" * 65),
        job(6, "WEIRD_STATE", "main"),
        job(7, "PENDING", ["main"], ["Priority"]),  # wrong types
    )
    families = job_families(queue, {"main", "gpu"}, pool_of)
    assert samples(families, "slonk_jobs_pending") == {
        ("main", "Priority"): 1,
        ("gpu", "Priority"): 1,
        ("other", "other"): 3,
    }
    assert samples(families, "slonk_jobs") == {
        ("main", "pending"): 1, ("gpu", "pending"): 1, ("other", "pending"): 3,
        ("main", "other"): 1,
    }  # fmt: skip


def running(job_id: int, user: str, details: list, nodes: list[str]) -> dict:
    """A running job record (the real job 1 of squeue.json) on `nodes`, with `details` as
    Slurm's gres_detail."""
    (record,) = [j for j in document("squeue.json")["jobs"] if j["job_id"] == 1]
    record = copy.deepcopy(record)
    allocation = record["job_resources"]["nodes"]["allocation"][0]
    record["job_resources"]["nodes"]["allocation"] = [{**allocation, "name": n} for n in nodes]
    record.update(job_id=job_id, user_name=user, gres_detail=details)
    return record


def test_each_gpu_a_running_job_holds_is_named_with_its_node_and_user():
    """Slurm's own document: job 1 on one node (its GPU 1), job 2 on two (GPU 0 of each), job
    3 pending (tests/unit/data/README.md)."""
    gpus = {"slonk-gpu-0": "gpu", "slonk-gpu-1": "gpu"}
    families = job_families(text("squeue-gpu.json"), {"main"}, lambda n: gpus.get(n, ""))
    assert samples(families, "slonk_job_gpu_info") == {
        ("1", "demo", "slonk-gpu-0", "1"): 1,
        ("2", "demo", "slonk-gpu-0", "0"): 1,
        ("2", "demo", "slonk-gpu-1", "0"): 1,
    }
    assert samples(families, "slonk_jobs") == {("main", "running"): 2, ("main", "pending"): 1}


def test_where_private_data_hides_jobs_no_job_is_named(demo_spec):
    families = job_families(text("squeue-gpu.json"), {"main"}, lambda n: "gpu", per_job=False)
    assert samples(families, "slonk_job_gpu_info") == {}
    assert samples(families, "slonk_jobs") == {("main", "running"): 2, ("main", "pending"): 1}
    for setting, private in [(None, False), ("usage", False), ("jobs,usage", True), ("USERS", True),
                             ("all", True), ("usage,job", True), ("user", True)]:  # fmt: skip
        conf = {"slurmConf": {"privateData": setting}} if setting else {}
        assert parse_spec({**demo_spec, **conf}).jobs_private() is private, setting
    comment = {"extraLines": ["# PrivateData=jobs"]}
    assert not parse_spec({**demo_spec, **comment}).jobs_private()
    assert parse_spec({**demo_spec, "extraLines": [" PrivateData=jobs "]}).jobs_private()


def test_a_job_holding_several_gpus_of_several_kinds_on_a_node_is_named_on_each():
    queue = jobs_document(
        running(7, "alice", ["gpu:h100:2(IDX:0-1)", "gpu:3(IDX:0,2-3),mps:0"], ["n2", "n3"]),
        running(9, "carol", [], ["n1"]),  # no GRES
    )
    assert samples(job_families(queue, {"main"}, pool_of), "slonk_job_gpu_info") == {
        ("7", "alice", "n2", "0"): 1, ("7", "alice", "n2", "1"): 1,
        ("7", "alice", "n3", "0"): 1, ("7", "alice", "n3", "2"): 1, ("7", "alice", "n3", "3"): 1,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("user", "details", "nodes", "expected"),
    [
        # A user name that would break the exposition's quoting is only "other".
        ('x"} 1\nslonk_up{a="', ["gpu:1(IDX:0)"], ["n2"], {("7", "other", "n2", "0"): 1}),
        ("alice", ["gpu:1(IDX:0)"], ["n4"], {}),  # a node no pool has
        ("alice", ["gpu:1(IDX:0)"], ["n2", "n3"], {}),  # details and nodes disagree
        ("alice", ["gpu:1(IDX:0-99999)"], ["n2"], {}),  # beyond any node's GPUs
        ("alice", ["gpu:1(IDX:3-1)"], ["n2"], {}),
        ("alice", ["gpu:1(IDX:-1)"], ["n2"], {}),
        ("alice", ["gpu:1(IDX:0)"[:9]], ["n2"], {}),  # cut short
        ("alice", [["gpu:1(IDX:0)"]], ["n2"], {}),  # not a string
        ("alice", "gpu:1(IDX:0)", ["n2"], {}),  # not a list
        ("alice", ["tpu:1(IDX:0)"], ["n2"], {}),  # another GRES
    ],
)
def test_a_jobs_gpu_labels_are_bounded(user, details, nodes, expected):
    queue = jobs_document(running(7, user, details, nodes))
    assert samples(job_families(queue, {"main"}, pool_of), "slonk_job_gpu_info") == expected


def test_broken_job_documents_fail_the_source():
    with pytest.raises(SlurmError, match="job_state"):
        job_families(jobs_document({"job_id": 1}), {"main"}, pool_of)


# sdiag


def test_sdiag_from_slurms_json():
    families = sdiag_families(text("sdiag.json"))
    names = {f.name for f in families}
    assert {
        "slonk_scheduler_cycle_last_seconds", "slonk_scheduler_cycle_mean_seconds",
        "slonk_scheduler_cycles_total", "slonk_scheduler_queue_length",
        "slonk_backfill_cycle_last_seconds", "slonk_backfill_cycles_total",
        "slonk_backfilled_jobs_total", "slonk_rpcs_total", "slonk_rpc_seconds_total",
        "slonk_server_threads", "slonk_agent_queue_size",
    } == names  # fmt: skip
    stats = document("sdiag.json")["statistics"]
    assert samples(families, "slonk_scheduler_cycles_total") == {(): stats["schedule_cycle_total"]}
    rpcs = samples(families, "slonk_rpcs_total")
    assert rpcs[("REQUEST_NODE_INFO",)] >= 1
    assert all(rpc.isupper() for (rpc,) in rpcs)


def test_hostile_sdiag():
    stats = document("sdiag.json")
    stats["statistics"]["schedule_cycle_last"] = "soon"
    stats["statistics"]["rpcs_by_message_type"] = [
        {"message_type": 'REQUEST_X"} 1\n', "count": 5},
        {"message_type": "REQUEST_OK", "count": 2, "total_time": 3_000_000},
        "not a record",
    ]
    families = sdiag_families(json.dumps(stats))
    assert samples(families, "slonk_scheduler_cycle_last_seconds") == {}
    assert samples(families, "slonk_rpcs_total") == {("REQUEST_OK",): 2}
    assert samples(families, "slonk_rpc_seconds_total") == {("REQUEST_OK",): 3.0}
    with pytest.raises(SlurmError, match="statistics"):
        sdiag_families("[]")


# Health results (workers)


def _plan() -> runner.CheckPlan:
    interfaces = {"names": ["lo"], "rdmaDevices": []}
    return runner.CheckPlan(
        Node("slonk-cpu-0", 0, ("slonk-cpu-0",)),
        True,
        {"interfaces": {"phases": ["interval"], "timeoutSeconds": 5, "options": interfaces}},
        10,
    )


def test_the_runner_saves_each_phases_results_for_the_worker_metrics(tmp_path):
    (result,) = runner.run(_plan(), "interval", state=tmp_path)
    saved = json.loads(runner.results_path("interval", tmp_path).read_text())
    assert saved[0]["check"] == "interfaces" and saved[0]["ok"] is result.ok
    assert set(saved[0]) == {"check", "ok", "detail", "seconds", "timed_out", "time"}
    families = health_families(tmp_path, "slonk-cpu-0")
    labels = ("slonk-cpu-0", "interfaces", "interval")
    ok = next(f for f in families if f.name == "slonk_health_check_ok")
    assert ok.samples == {labels: 0.0}  # lo has no global address
    last = next(f for f in families if f.name == "slonk_health_check_last_run_timestamp_seconds")
    assert last.samples[labels] == saved[0]["time"]


def test_a_run_where_no_plan_lives_saves_nothing(tmp_path):
    runner.run(_plan(), "interval", state=tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_a_sites_own_checks_are_served_within_their_shape_and_number(tmp_path):
    """health.active.commands: at most 8 names of the spec's shape; anything beyond is not."""
    checks = [f"active:site-{i}" for i in range(10)] + ["active:Bad_Name", "active:x" * 20]
    runner.results_path("active", tmp_path).write_text(json.dumps([
        {"check": check, "ok": False, "seconds": 1, "time": 5} for check in checks
    ]))  # fmt: skip
    ok = next(f for f in health_families(tmp_path, "n") if f.name == "slonk_health_check_ok")
    assert sorted(labels[1] for labels in ok.samples) == [f"active:site-{i}" for i in range(8)]


def test_hostile_health_results(tmp_path):
    runner.results_path("prolog", tmp_path).write_text(json.dumps([
        {"check": 'gpu"} 1\n', "ok": True, "seconds": 1, "time": 5},
        {"check": "storage", "ok": "yes", "seconds": "long", "time": None},
        "junk",
    ]))  # fmt: skip
    runner.results_path("boot", tmp_path).write_text("{not json")
    (tmp_path / "results-evil.json").write_text("[]")
    with pytest.raises(RecordError, match=r"results-boot\.json") as caught:
        health_families(tmp_path, "slonk-cpu-0")
    ok, duration, _ = caught.value.families  # the readable phase is still served
    assert ok.samples == {("slonk-cpu-0", "storage", "prolog"): 0.0}
    assert duration.samples == {("slonk-cpu-0", "storage", "prolog"): 0.0}


# Syncer stats and the node history


def test_syncer_stats(tmp_path):
    stats = tmp_path / "syncer-stats.json"
    assert syncer_families(stats) == []  # the syncer wrote none yet
    stats.write_text(json.dumps({
        "passes": 12, "errors": 1, "lastPassSeconds": 0.2,
        "actions": {"drain": 3, "resume": 2, "down": 0, "lend": 1, "give-back": 1, "evil\n": 9},
    }))  # fmt: skip
    families = syncer_families(stats)
    assert samples(families, "slonk_syncer_passes_total") == {(): 12}
    assert samples(families, "slonk_syncer_errors_total") == {(): 1}
    assert samples(families, "slonk_syncer_actions_total") == {
        ("drain",): 3, ("resume",): 2, ("lend",): 1, ("give-back",): 1,
    }  # fmt: skip
    stats.write_text("[1, 2")
    with pytest.raises(RecordError, match="not JSON"):
        syncer_families(stats)
    stats.write_text(" " * 100_000)
    with pytest.raises(RecordError, match="larger than"):
        syncer_families(stats)


def _event(event: str, cause: str, reason: str = "") -> str:
    return json.dumps({
        "time": 1.0, "event": event, "node": "slonk-gpu-0", "machine": "m1", "gpus": [],
        "pod": "slonk-gpu-0", "podUID": "", "cause": cause, "reason": reason,
    }) + "\n"  # fmt: skip


def test_node_events_count_from_when_the_exporter_started(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text(_event("drain", "gpu"))  # before the exporter: not counted
    counter = EventCounter(path)
    events = samples(counter.families(), "slonk_node_events_total")
    assert events == {}
    with path.open("a") as file:
        file.write(_event("recycle", "gpu") + _event("recycle", "gpu"))
        file.write(_event("quarantine", "quarantine"))
        file.write(_event("drain", 'evil"} 1\n', "slonk:storage: read-only"))
        file.write(_event("explode", "gpu"))
    assert samples(counter.families(), "slonk_node_events_total") == {
        ("recycle", "gpu"): 2, ("quarantine", "quarantine"): 1, ("drain", "storage"): 1,
    }  # fmt: skip


# The collector: a failing source, and promtool


def _controller_sources(tmp_path) -> dict:
    pools = lambda n: POOLS.get(n, "")  # noqa: E731
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"passes": 1, "errors": 0, "actions": {"drain": 1}}))
    return {
        "nodes": lambda: node_families(text("scontrol-show-node.json"), pools),
        "jobs": lambda: job_families(text("squeue.json"), {"main"}, pool_of),
        "sdiag": lambda: sdiag_families(text("sdiag.json")),
        "syncer": lambda: syncer_families(stats),
    }


def _render(collector: SourcesCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_a_failing_source_is_counted_and_the_others_served(tmp_path, capsys):
    sources = _controller_sources(tmp_path)
    sources["sdiag"] = lambda: sdiag_families("sdiag: error: Unable to contact slurm\n")
    collector = SourcesCollector(sources, fresh=0)
    _render(collector)
    out = _render(collector)
    assert 'slonk_exporter_scrape_errors_total{source="sdiag"} 2.0' in out
    assert 'slonk_exporter_scrape_errors_total{source="nodes"} 0.0' in out
    assert 'slonk_nodes{cause="gpu",pool="cpu",state="drained"} 1.0' in out
    assert "slonk_scheduler" not in out
    assert "sdiag: 'sdiag --json: output is not JSON" in capsys.readouterr().err


def test_a_source_that_hangs_leaves_the_others_served_and_is_never_read_twice_at_once(tmp_path):
    """A hung slurmctld: the scrape answers by its deadline, saying which source failed."""
    hung, calls = threading.Event(), []

    def sdiag() -> list:
        calls.append(1)
        hung.wait()
        return []

    sources = _controller_sources(tmp_path)
    sources["sdiag"] = sdiag
    collector = SourcesCollector(sources, deadline=0.05, fresh=0)
    try:
        first, second = _render(collector), _render(collector)
    finally:
        hung.set()
    assert 'slonk_nodes{cause="gpu",pool="cpu",state="drained"} 1.0' in first
    assert 'slonk_exporter_scrape_errors_total{source="sdiag"} 2.0' in second
    assert calls == [1]  # still reading since the first scrape: not asked again


def test_requests_share_a_fresh_scrape(tmp_path):
    """However many ask (a flood of requests included), Slurm is read once per fresh period."""
    calls = []
    sources = {"nodes": lambda: calls.append(1) or node_families(text("scontrol-show-node.json"),
                                                                 lambda n: "")}  # fmt: skip
    collector = SourcesCollector(sources, fresh=3600)
    threads = [threading.Thread(target=_render, args=(collector,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert "slonk_nodes" in _render(collector)
    assert calls == [1]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian's prometheus)")
def test_promtool_accepts_what_the_exporter_serves(tmp_path):
    runner.results_path("interval", tmp_path).write_text(
        json.dumps([{"check": "dns", "ok": True, "detail": "", "seconds": 0.1, "time": 1.0}])
    )
    controller = _render(SourcesCollector(_controller_sources(tmp_path)))
    worker = _render(SourcesCollector({"health": lambda: health_families(tmp_path, "n1")}))
    for out in (controller, worker):
        checked = subprocess.run(
            ["promtool", "check", "metrics"], input=out, capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "slonk_rpcs_total" in controller and "slonk_health_check_ok" in worker


# cluster.yaml: metrics.port, and who runs the service


def test_the_spec_reads_pools_and_partitions_again_when_it_changes(tmp_path, demo_spec):
    import yaml

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(demo_spec))
    spec = Spec(path)
    spec.refresh()
    assert (spec.pool_of("slonk-gpu-3"), spec.pool_of("slonk-gpu-4")) == ("gpu", "")
    assert spec.partitions == {"main", "gpu"}
    demo_spec["nodepools"]["gpu"]["replicas"] = 5
    path.write_text(yaml.safe_dump(demo_spec) + "# changed\n")
    spec.refresh()
    assert spec.pool_of("slonk-gpu-4") == "gpu"


def test_a_backup_controllers_scrape_asks_who_holds_control_once(tmp_path, demo_spec, monkeypatch):
    """With a backup, the cluster's figures come from the pod in control alone; the five
    sources of one scrape share one look (an `scontrol ping` each, else)."""
    import yaml

    from slonk.metrics import sources
    from slonk.slurm import control

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({**demo_spec, "backupController": {}}))
    asked: list[str] = []
    monkeypatch.setattr(control, "in_control", lambda spec, pod: asked.append(pod) or False)
    monkeypatch.setenv("POD_NAME", "slonk-controller-1")
    read = sources.controller(Spec(path))
    assert [read[name]() for name in ("nodes", "jobs", "sdiag", "history", "syncer")] == [[]] * 5
    assert asked == ["slonk-controller-1"]  # a standby exports none of them, and asked once


def test_metrics_port(demo_spec):
    assert parse_spec(demo_spec).metrics is None
    demo_spec["metrics"] = {}
    assert parse_spec(demo_spec).metrics.port == 9341
    demo_spec["metrics"] = {"port": 9100}
    assert parse_spec(demo_spec).metrics.port == 9100


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({"port": 0}, "metrics.port: must be >= 1"),
        ({"port": 70000}, "metrics.port: must be <= 65535"),
        ({"port": "9341"}, "metrics.port: expected an integer"),
        ({"port": True}, "metrics.port: expected an integer, got a boolean"),
        ({"port": 6818}, "metrics.port: 6818 is slurmdPort's port"),
        ({"port": 22}, "metrics.port: 22 is sshd's port"),
        ({"enabled": True}, "metrics.enabled: unknown key"),
        (9341, "metrics: expected a mapping"),
    ],
)
def test_bad_metrics_settings_name_the_key(demo_spec, metrics, message):
    demo_spec["metrics"] = metrics
    with pytest.raises(SpecError, match=message):
        parse_spec(demo_spec)


def _no_inotify():
    raise OSError(errno.EMFILE, "Too many open files")


def test_the_metrics_task_runs_on_the_controller_and_workers_when_asked(demo_spec, tmp_path):
    def tasks(spec, role):
        changes = Changes(lambda line: None, make=_no_inotify)
        return [t.name for t in tasks_for(spec, role, "p", changes, tmp_path / "cluster.yaml")]

    off = parse_spec(demo_spec)
    demo_spec["metrics"] = {"port": 9341}
    on = parse_spec(demo_spec)
    for role in ("controller", "worker"):
        assert "metrics" not in tasks(off, role)
        assert "metrics" in tasks(on, role)
    assert "metrics" not in tasks(on, "login")


# What job-time programs load


def test_job_time_programs_and_the_cause_label_do_not_load_prometheus_client():
    """Slurm runs the prolog, epilog and health programs for every job and every interval:
    they must not pay for the exporter's library, nor must the syncer's cause label."""
    modules = (
        "slonk.health.command", "slonk.hooks.dispatch", "slonk.health.drains", "slonk.metrics",
    )  # fmt: skip
    code = f"import sys; import {', '.join(modules)}; print(sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "prometheus_client" not in loaded
    assert "slonk.metrics.collector" not in loaded


def test_an_exporter_started_after_a_compaction_counts_only_new_events(tmp_path, monkeypatch):
    path = tmp_path / "history.jsonl"
    monkeypatch.setattr(history, "MAX_BYTES", 2000)
    monkeypatch.setattr(history, "KEEP_BYTES", 1000)
    old = history.Event(time=1.0, event="drain", node="slonk-gpu-0", cause="gpu")
    history.append([old] * 20, path)
    assert path.read_bytes().startswith(b'{"base": ')  # compacted: offsets are not sizes
    counter = EventCounter(path)
    assert samples(counter.families(), "slonk_node_events_total") == {}
    history.append(
        [history.Event(time=2.0, event="recycle", node="slonk-gpu-0", cause="gpu")], path
    )
    assert samples(counter.families(), "slonk_node_events_total") == {("recycle", "gpu"): 1}
