"""What active checks cost users, in one run: the same local cluster (two nodes of two fake GPUs,
one controller, accounting off) with `health.active` off, on with healthy GPUs, on with every
check a ten-minute diagnostic (the fake's `long-check`, its timeout 15 minutes: a user's job
arriving at a node that holds one must preempt it; once preempted, a node is offered its
checks again only after ten minutes, so each node's check meets at most one job a run), and on
with a site's ten-minute check alone that spans both nodes (slonk.align.fabric: each run holds
the two until a user's job preempts it).
Prints one JSON document.

Each run spends WARM_SECONDS idle first (with the schedule on, each node's first check is due a
minute after its slurmd started), then: SPACED single jobs a few seconds apart (sbatch to
completion, the latency users feel, on nodes that went idle in between: a check may have
started), then BURST trivial jobs at once (throughput). Same values and workload on each side
but for `health.active`; every job must complete. Local mode's figures: two cores, fake GPUs.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from slonk.local import cluster as local

SPACED = 40
GAP_SECONDS = 4
BURST = 200
WARM_SECONDS = 70
VALUES = {
    "nodepools": {
        "cpu": None,
        "gpu": {"replicas": 2, "cpus": 2, "memoryMiB": 1024, "gpus": {"count": 2, "type": "h100"}},
    },
    "partitions": {"main": {"pools": ["gpu"]}},
    "accounting": {"enabled": False},
    "metrics": {"enabled": False},
    "syncer": {"enabled": False},
}
ACTIVE = {"intervalSeconds": 60, "startsPerMinute": 60}  # every node once a minute
# The long diagnostics' own timeout: longer than they take, so that they are checks a user's
# job preempts, not hung probes that fail at their timeout.
LONG = {**ACTIVE, "checks": {c: {"timeoutSeconds": 900} for c in ("gpu-memory", "gpu-compute")}}
# A site's check that spans the block (the pool: both nodes), alone, ten minutes long: each of
# its runs holds both nodes until a user's job preempts it.
BLOCK_CHECK = "/home/.site-check/fabric"
BLOCK = {
    **ACTIVE,
    "checks": {c: {"enabled": False} for c in ("gpu-memory", "gpu-compute")},
    "commands": {"fabric": {"command": BLOCK_CHECK, "timeoutSeconds": 900, "span": "block"}},
}

WORKLOAD = f"""\
now() {{ date +%s%N; }}
drain() {{ while [ -n "$(squeue --noheader --format=%i 2>/dev/null)" ]; do sleep 0.2; done; }}
for i in $(seq {SPACED}); do
  sleep {GAP_SECONDS}
  t0=$(now)
  j=$(sbatch --parsable --gres=gpu:1 --output=/dev/null --wrap true)
  while [ -n "$(squeue --noheader --jobs "$j" --format=%i 2>/dev/null)" ]; do sleep 0.01; done
  echo "latency_ms $(( ($(now) - t0) / 1000000 ))"
done
t0=$(now)
for i in $(seq {BURST}); do sbatch --parsable --output=/dev/null --wrap true >/dev/null; done
drain
echo "burst_ms $(( ($(now) - t0) / 1000000 ))"
squeue --states=all --noheader --format=%T | sort | uniq -c | sed 's/^ */state /'
"""
CHECK_JOBS = "squeue --all --states=all --noheader --partition=slonk-active --format=%T"


def run(active: dict | None, scenario: str) -> dict:
    values = dict(VALUES, health={"active": {"enabled": active is not None, **(active or {})}})
    with tempfile.TemporaryDirectory(prefix="slonk-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        cluster = local.up(state_dir, [path], progress=lambda m: None)
        try:
            controller = "slonk-controller-0"
            for node in ("slonk-gpu-0", "slonk-gpu-1"):
                command = f"mkdir -p /home/.fake-gpu && echo {scenario} > /home/.fake-gpu/{node}"
                subprocess.run(cluster.enter(controller, ["sh", "-c", command]), check=True)
            program = (
                f"mkdir -p /home/.site-check && printf '#!/bin/sh\\nsleep 600\\n' > {BLOCK_CHECK}"
            )
            program += f" && chmod 755 {BLOCK_CHECK}"
            subprocess.run(cluster.enter(controller, ["sh", "-c", program]), check=True)
            time.sleep(WARM_SECONDS)
            workload = subprocess.run(
                cluster.ssh("demo", ["sh", "-s"]),
                input=WORKLOAD,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            checks = subprocess.run(
                cluster.enter(controller, ["sh", "-c", CHECK_JOBS]),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
        finally:
            local.down(state_dir, purge=True, progress=lambda m: None)
    rows = [line.split() for line in workload.splitlines() if line.strip()]
    latencies = sorted(int(r[1]) for r in rows if r[0] == "latency_ms")
    states = {r[2]: int(r[1]) for r in rows if r[0] == "state"}
    if set(states) != {"COMPLETED"} or states["COMPLETED"] != SPACED + BURST:
        raise RuntimeError(f"not every job completed: {states}")
    burst = int(re.search(r"burst_ms (\d+)", workload).group(1)) / 1000
    return {
        "latency_ms_median": statistics.median(latencies),
        "latency_ms_p90": latencies[int(len(latencies) * 0.9) - 1],
        "latency_ms_max": latencies[-1],
        "burst_jobs_per_second": round(BURST / burst, 1),
        "check_jobs": {state: checks.count(state) for state in sorted(set(checks))},
    }


def main() -> None:
    off = run(None, "healthy")
    healthy = run(ACTIVE, "healthy")
    long_checks = run(LONG, "long-check")
    block = run(BLOCK, "healthy")
    print(
        json.dumps(
            {
                "benchmark": "active_checks",
                "mode": "slonk local: 2 cores, fake GPUs, 2 nodes of 2",
                "spaced_jobs": SPACED,
                "gap_seconds": GAP_SECONDS,
                "burst_jobs": BURST,
                "active_off": off,
                "active_on_healthy": healthy,
                "active_on_every_check_ten_minutes": long_checks,
                "active_on_a_ten_minute_check_spanning_both_nodes": block,
                "ratio_latency_median_on_vs_off": round(
                    healthy["latency_ms_median"] / off["latency_ms_median"], 2
                ),
                "ratio_burst_throughput_on_vs_off": round(
                    healthy["burst_jobs_per_second"] / off["burst_jobs_per_second"], 2
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
