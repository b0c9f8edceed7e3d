"""Metrics through Debian's real Prometheus (`slonk local up --prometheus`), checked with PromQL
over its HTTP API against what Slurm itself says (sinfo, squeue): node counts by state, a
drained node under its cause, and pending jobs per partition and their reasons (the
quarantine counter is test_local_health's, read from the exporter), every GPU's series and a
running job's GPUs joined to them. A small cluster: the controller and two workers with two
fake GPUs each (GRES; their checks read the fake nvidia-smi of tests/fakes), no login pod, no
directory, no accounting (root submits)."""

from __future__ import annotations

import collections
import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from slonk.local import prometheus
from slonk.local.state import Cluster

from ..support.cluster import FAKE_GPU, SCRATCH, LocalCluster, cluster_of_its_own, wait_for

CONTROLLER = "slonk-controller-0"
WORKERS = ("slonk-gpu-0", "slonk-gpu-1")
BAD = WORKERS[1]
PORT = 9341
VALUES = {
    "nodepools": {
        "cpu": None,
        "gpu": {"replicas": 2, "cpus": 2, "memoryMiB": 512, "gpus": {"count": 2}},
    },
    "partitions": {"main": {"pools": ["gpu"], "default": True}, "short": {"pools": ["gpu"]}},
    "login": {"replicas": 0},
    "ldap": {"dev": {"enabled": False}},
    "accounting": {"enabled": False},
    "health": {
        "intervalSeconds": 2,
        "checks": {
            "gpu": {
                "expectedCount": 2,
                "nvidiaSmi": f"{FAKE_GPU} nvidia-smi",
                "dmesg": f"{FAKE_GPU} dmesg",
            },
            "scratch": {"path": SCRATCH},
        },
        # As good as off until the quarantine test turns it up.
        "recycle": {"idleSeconds": 3600, "periodSeconds": 1},
    },
    "syncer": {"slurmPollSeconds": 1},
}
# (the node's state word in sinfo's %T, less its flag suffixes) -> the exporter's `state`.
SINFO_STATES = {"powered_down": "powered_down", "powering_up": "powering_up"}


class Metrics(LocalCluster):
    """The cluster, with PromQL over its Prometheus's HTTP API."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.url = prometheus.url(Cluster(state_dir))
        assert self.url, "slonk local up --prometheus wrote no address"

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def by(self, promql: str, *labels: str) -> dict[tuple[str, ...], float]:
        """An instant vector, keyed by the labels' values; samples of 0 left out (a state no
        node is in may be served as 0 or not at all)."""
        result = self.api("query", query=promql)["result"]
        found = {
            tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in result
        }
        return {key: value for key, value in found.items() if value}

    def controller(self, command: str) -> str:
        return self.pod(CONTROLLER).check_output(command)

    def sinfo_states(self) -> dict[tuple[str, ...], float]:
        """Nodes by state, from sinfo (one line per node and partition: each node once)."""
        states = {}
        for line in self.controller("sinfo -h -N -o '%N %T'").splitlines():
            node, state = line.split()
            word = state.rstrip("*~#!%$@^-+")
            states[node] = SINFO_STATES.get(word, word)
        counts = collections.Counter(states.values())
        return {(state,): float(n) for state, n in counts.items()}

    def squeue_pending(self) -> dict[tuple[str, ...], float]:
        """Pending jobs by (partition, reason), from squeue."""
        lines = self.controller("squeue -h -t PENDING -o '%P %r'").splitlines()
        counts = collections.Counter(tuple(line.split()) for line in lines)
        return {key: float(n) for key, n in counts.items()}

    def node(self, name: str) -> tuple[str, str]:
        return self.nodes().get(name, ("", ""))

    def same(self, what: str, promql: str, labels: tuple[str, ...], truth: Any) -> None:
        """Waits until the query says what Slurm says (both read afresh each time)."""
        seen: dict[str, Any] = {}

        def agree() -> bool:
            seen["prometheus"], seen["slurm"] = self.by(promql, *labels), truth()
            return bool(seen["slurm"]) and seen["prometheus"] == seen["slurm"]

        try:
            wait_for(what, agree)
        except AssertionError as err:
            raise AssertionError(f"{err}; last seen: {seen}") from None


metrics = cluster_of_its_own("metrics", VALUES, Metrics, "--prometheus", idle=WORKERS)


def _gpu_fault(cluster: Metrics, scenario: str, pod: str = BAD, via: str | None = None) -> None:
    """The fake nvidia-smi's state for `pod`, in the shared /home (it outlives the pod)."""
    cluster.pod(via or pod).check_output(
        f"mkdir -p /home/.fake-gpu && echo {scenario} > /home/.fake-gpu/{pod}"
    )


def _heal(cluster: Metrics, pod: str = BAD) -> None:
    cluster.pod(WORKERS[0]).run(f"rm -f /home/.fake-gpu/{pod}")


def test_prometheus_scrapes_the_controller_and_every_worker(metrics: Metrics):
    def targets() -> dict[str, dict[str, Any]]:
        active = metrics.api("targets", state="active")["activeTargets"]
        return {t["labels"]["pod"]: t for t in active}

    found = wait_for("Prometheus's targets", targets)
    local = Cluster(metrics.state_dir)
    assert {pod: t["scrapeUrl"] for pod, t in found.items()} == {
        pod: f"http://{local.address(pod)}:{PORT}/metrics" for pod in (CONTROLLER, *WORKERS)
    }
    health: dict[str, str] = {}

    def all_up() -> bool:
        health.update({pod: f"{t['health']} {t['lastError']}" for pod, t in targets().items()})
        return all(h.startswith("up ") for h in health.values())

    try:
        wait_for("every target scraped", all_up)
    except AssertionError as err:
        raise AssertionError(f"{err}; last seen: {health}") from None


def test_every_gpu_of_every_worker_has_its_series(metrics: Metrics):
    """slonk.metrics.gpus through the workers' exporters and Prometheus: the fake's idle H100s
    (utilization is 0, so `by` leaves it out; temperature and memory are not)."""
    gpus = {(node, gpu) for node in WORKERS for gpu in ("0", "1")}
    temperatures = wait_for(
        "every GPU's temperature",
        lambda: (
            (t := metrics.by("slonk_gpu_temperature_celsius", "node", "gpu")).keys() == gpus and t
        ),
    )
    assert set(temperatures.values()) == {31.0}
    total = metrics.by("slonk_gpu_memory_total_bytes", "node", "gpu")
    assert total == dict.fromkeys(gpus, 81559.0 * 2**20)
    # NVLink's counters a GPU, through slonk's NVML reader over the fake's library, which
    # counts as a Hopper does: crc, replay and recovery (no crc_data).
    kinds = metrics.by("count by (node, gpu) (slonk_gpu_nvlink_errors_total)", "node", "gpu")
    assert kinds == dict.fromkeys(gpus, 3.0)


def test_a_running_jobs_gpus_are_named_with_it_and_its_figures_joined(metrics: Metrics):
    """The controller's exporter names each GPU a running job holds (Slurm's GRES detail),
    and the GPU series join on it: the dashboard's per-job panels."""
    node = WORKERS[0]
    job = metrics.controller(
        f"sbatch --parsable --gres=gpu:2 -w {node} -o /dev/null --wrap 'sleep 600'"
    ).strip()
    try:
        held = wait_for(
            "the job's GPUs in Prometheus",
            lambda: metrics.by(
                f'slonk_job_gpu_info{{job_id="{job}"}}', "job_id", "user", "node", "gpu"
            ),
        )
        assert held == {(job, "root", node, "0"): 1.0, (job, "root", node, "1"): 1.0}
        joined = metrics.by(
            "sum by (job_id, user) (slonk_gpu_memory_total_bytes"
            " * on (node, gpu) group_left (job_id, user) slonk_job_gpu_info)",
            "job_id",
            "user",
        )
        assert joined == {(job, "root"): 2 * 81559.0 * 2**20}
    finally:
        metrics.controller(f"scancel {job}")
    wait_for(
        "the job's GPUs gone once it ended",
        lambda: not metrics.by(f'slonk_job_gpu_info{{job_id="{job}"}}', "job_id"),
    )


def test_node_counts_match_sinfo(metrics: Metrics):
    metrics.same("nodes by state", "sum by (state) (slonk_nodes)", ("state",), metrics.sinfo_states)
    assert metrics.by('sum by (pool) (slonk_nodes{pool="gpu"})', "pool") == {("gpu",): 2.0}


def test_pending_jobs_per_partition_match_squeue(metrics: Metrics):
    held = [
        metrics.controller(f"sbatch --parsable --hold -p {partition} -o /dev/null --wrap true")
        for partition in ("main", "main", "short")
    ]
    try:
        metrics.same(
            "pending jobs by partition and reason",
            "sum by (partition, reason) (slonk_jobs_pending)",
            ("partition", "reason"),
            metrics.squeue_pending,
        )
        assert metrics.squeue_pending() == {
            ("main", "JobHeldUser"): 2.0,
            ("short", "JobHeldUser"): 1.0,
        }
        assert metrics.by('sum by (partition) (slonk_jobs{state="pending"})', "partition") == {
            ("main",): 2.0,
            ("short",): 1.0,
        }
    finally:
        metrics.controller(f"scancel {' '.join(j.strip().split(';')[0] for j in held)}")


def test_a_gpu_fault_drains_its_node_under_cause_gpu(metrics: Metrics):
    _gpu_fault(metrics, "ecc")
    try:
        wait_for(
            f"{BAD} drained by its GPU check",
            lambda: (
                metrics.node(BAD)[1].startswith("slonk:gpu:") and "drain" in metrics.node(BAD)[0]
            ),
        )
        metrics.same(
            "the drained node under cause gpu",
            "sum by (state, cause) (slonk_nodes)",
            ("state", "cause"),
            lambda: (
                {("drained", "gpu"): 1.0, ("idle", "none"): 1.0}
                if metrics.node(BAD)[0] == "idle+drain"
                else {}
            ),
        )
        metrics.same(
            "nodes by state, one drained",
            "sum by (state) (slonk_nodes)",
            ("state",),
            metrics.sinfo_states,
        )
    finally:
        _heal(metrics)
    wait_for(f"{BAD} resumed once healed", lambda: metrics.node(BAD)[0] == "idle")
