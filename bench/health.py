"""Health checks, measured in one run. Prints one JSON document.

- the check sets on a healthy node: prolog (what runs before every job, through the same
  wrapper Slurm runs: dispatcher plus checks) and interval (Slurm's HealthCheckProgram,
  which also asks slurmctld for the node's state); a 2-GPU fake nvidia-smi answers for GPUs;
- per-job overhead: 500 jobs through a cluster with health checks off, then on
  (bench/local_cluster.py's workload);
- fault to drain: /home remounted read-only on one worker, timed until Slurm shows the node
  drained, FAULTS times, with HealthCheckInterval INTERVAL s; healed and resumed in between.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from local_cluster import workload

from slonk.local import cluster as local

FAKE_GPU = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "fake-gpu"
INTERVAL = 10
FAULTS = 5
WORKER = "slonk-cpu-1"
HEALTH = f"""\
health:
  intervalSeconds: {INTERVAL}
  checks:
    gpu: {{expectedCount: 2, nvidiaSmi: "{FAKE_GPU} nvidia-smi", dmesg: "{FAKE_GPU} dmesg"}}
"""


def program_ms(cluster: local.Cluster, program: str, runs: int = 20) -> float:
    """Mean wall time of one run of a program slurm.conf names, inside a worker."""
    timing = (
        "import subprocess,time\n"
        "t=time.perf_counter()\n"
        f"for _ in range({runs}): subprocess.run(['{program}'], capture_output=True)\n"
        f"print((time.perf_counter()-t)/{runs}*1000)\n"
    )
    out = cluster.run(WORKER, [sys.executable, "-c", timing])
    return round(float(out.stdout), 1)


def node_state(cluster: local.Cluster) -> str:
    node = local.node_states(cluster).get(WORKER)
    return node.label if node else ""


def fault_to_drain(cluster: local.Cluster) -> list[float]:
    seconds = []
    for _ in range(FAULTS):
        cluster.run(WORKER, ["mount", "-o", "remount,bind,ro", "/home"])
        started = time.perf_counter()
        while node_state(cluster) != "idle+drain":
            time.sleep(0.05)
        seconds.append(round(time.perf_counter() - started, 2))
        cluster.run(WORKER, ["mount", "-o", "remount,bind,rw", "/home"])
        while node_state(cluster) != "idle":  # resumed by the next run
            time.sleep(0.05)
    return seconds


def up(state: Path, values: str) -> local.Cluster:
    values_file = state.with_suffix(".yaml")
    values_file.write_text(values)
    return local.up(state, [values_file], progress=lambda m: None)


def main() -> None:
    result: dict = {"benchmark": "health", "health_check_interval_seconds": INTERVAL}
    with tempfile.TemporaryDirectory(prefix="slonk-bench-health-") as tmp:
        plain, checked = Path(tmp) / "plain", Path(tmp) / "checked"
        try:
            cluster = up(plain, "health: {enabled: false}\n")
            result["jobs_without_checks"] = workload(cluster.ssh("demo", ["sh", "-s"]))
        finally:
            local.down(plain, purge=True, progress=lambda m: None)
        try:
            cluster = up(checked, HEALTH)
            result["prolog_program_ms"] = program_ms(cluster, "/run/slonk/bin/prolog")
            result["health_check_program_ms"] = program_ms(cluster, "/run/slonk/bin/health")
            result["jobs_with_checks"] = workload(cluster.ssh("demo", ["sh", "-s"]))
            drains = fault_to_drain(cluster)
            result["fault_to_drain_seconds"] = {
                "faults": FAULTS,
                "median": statistics.median(drains),
                "max": max(drains),
                "all": drains,
            }
        finally:
            local.down(checked, purge=True, progress=lambda m: None)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
