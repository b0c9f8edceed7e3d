"""slonk local against a bare slurmctld/slurmd pair, in one run. Prints one JSON document.

- cold start: `slonk local up` to every node idle, split into the init layer (what
  `slonk init` reports per pod) and the rest (namespaces, daemons starting, registration);
  Slonk's public images start with fixed `sleep 10` steps.
- job latency (sbatch to completion, sequential) and throughput of 500 trivial jobs, through
  the local cluster's login pod and on the bare pair; the ratio is the figure. The local
  cluster runs again without slonk's Epilog (its one per-job program here), to show where
  the difference goes.
Like for like: both sides are one controller and one 8-CPU node with the slurm.conf slonk
renders for them (bare_pair.slonk_config: the bare pair leaves out only slonk's programs), and
every job is demo's; each side must see all 1,020 jobs COMPLETED.
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

from bare_pair import ONE_NODE, BarePair

from slonk.local import cluster as local

JOBS = 500
LATENCY_RUNS = 20

# Run by `sh` where the jobs are submitted: sequential latencies, a burst of JOBS one sbatch
# each (the submitting shell often sets the pace), then JOBS as one array (what running them
# costs: array tasks are jobs to slurmd, each with its Prolog and Epilog).
WORKLOAD = """\
now() { date +%s%N; }
# Polled every 0.2 s: squeue every 10 ms would compete with the jobs for slurmctld and the CPUs.
drain() { while [ -n "$(squeue --noheader --format=%i 2>/dev/null)" ]; do sleep 0.2; done; }
for i in $(seq LATENCY_RUNS); do
  t0=$(now)
  j=$(sbatch --parsable --output=/dev/null --wrap true)
  while [ -n "$(squeue --noheader --jobs "$j" --format=%i 2>/dev/null)" ]; do sleep 0.01; done
  echo "latency_ms $(( ($(now) - t0) / 1000000 ))"
done
t0=$(now)
for i in $(seq JOBS); do sbatch --parsable --output=/dev/null --wrap true >/dev/null; done
echo "submitted_ms $(( ($(now) - t0) / 1000000 ))"
drain
echo "throughput_total_ms $(( ($(now) - t0) / 1000000 ))"
t0=$(now)
sbatch --parsable --array=1-JOBS --output=/dev/null --wrap true >/dev/null
drain
echo "array_total_ms $(( ($(now) - t0) / 1000000 ))"
# How the jobs ended (slurmctld keeps finished jobs MinJobAge, 300 s): all must have COMPLETED.
squeue --states=all --array --noheader --format=%T | sort | uniq -c | sed 's/^ */state /'
""".replace("LATENCY_RUNS", str(LATENCY_RUNS)).replace("JOBS", str(JOBS))


# slonk's Epilog (slonk.health.leftovers: what a user left on the node goes with their last
# job there), its one program in every job at these values.
NO_EPILOG = "slurm: {slurmConf: {Epilog: null}}\n"
# What every job's mount namespace copies (job_container/tmpfs): slurmd's mount table.
SLURMD_MOUNTS = "wc -l < /proc/$(pgrep -x slurmd)/mounts"


def _count(argv: list[str]) -> int:
    return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def workload(argv: list[str]) -> dict:
    out = subprocess.run(argv, input=WORKLOAD, capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    latencies = [int(row[1]) for row in rows if row[0] == "latency_ms"]
    total = int(re.search(r"throughput_total_ms (\d+)", out).group(1))
    array = int(re.search(r"array_total_ms (\d+)", out).group(1))
    states = {row[2]: int(row[1]) for row in rows if row[0] == "state"}
    if set(states) != {"COMPLETED"}:
        raise RuntimeError(f"not every job completed: {states}")
    return {
        "latency_ms_median": statistics.median(latencies),
        "latency_ms_p90": sorted(latencies)[int(len(latencies) * 0.9) - 1],
        "jobs": JOBS,
        "throughput_seconds": total / 1000,
        "jobs_per_second": round(JOBS / (total / 1000), 1),
        "submit_seconds": int(re.search(r"submitted_ms (\d+)", out).group(1)) / 1000,
        "array_jobs_per_second": round(JOBS / (array / 1000), 1),
        "jobs_completed": states["COMPLETED"],
    }


def local_cluster(state_dir: Path, values_text: str) -> dict:
    values = state_dir.parent / "values.yaml"
    values.write_text(values_text)
    events: list[tuple[float, str]] = []
    # Wall-clock time: each pod's launch is when its log-start file was written.
    started = time.time()
    cluster = local.up(state_dir, [values], progress=lambda m: events.append((time.time(), m)))
    up_seconds = time.time() - started
    pod_started = {
        name: (cluster.pod_dir(name) / "log-start").stat().st_mtime for name in cluster.pod_names()
    }
    init_ms = {}
    for name in pod_started:
        log = (cluster.pod_dir(name) / "log").read_text()
        init_ms[name] = float(re.search(r"ready in (\d+) ms", log).group(1))
    launched = min(pod_started.values())
    init_done = max(pod_started[n] + init_ms[n] / 1000 for n in pod_started)
    idle_at = events[-1][0]
    result = {
        "up_to_idle_seconds": round(up_seconds, 3),
        "render_and_setup_seconds": round(launched - started, 3),
        "init_layer_ms_per_pod": init_ms,
        "init_layer_seconds": round(init_done - launched, 3),
        "daemons_to_idle_seconds": round(idle_at - init_done, 3),
    }
    mounts = cluster.enter("slonk-cpu-0", ["sh", "-c", SLURMD_MOUNTS])
    result["slurmd_mounts_before"] = _count(mounts)
    result.update(workload(cluster.ssh("demo", ["sh", "-s"])))
    result["slurmd_mounts_after"] = _count(mounts)
    return result


def local_run(values_text: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="slonk-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        try:
            return local_cluster(state_dir, values_text)
        finally:
            local.down(state_dir, purge=True, progress=lambda m: None)


def main() -> None:
    ours = local_run(ONE_NODE)
    # Where the difference goes: the same cluster without slonk's one per-job program.
    no_epilog = local_run(ONE_NODE + NO_EPILOG)
    bare = BarePair()
    try:
        baseline = {"up_to_idle_seconds": round(bare.start(), 3)}
        baseline["slurmd_mounts_before"] = _count(bare.argv(SLURMD_MOUNTS))
        baseline.update(workload(bare.argv("sh -s", user=True)))
        baseline["slurmd_mounts_after"] = _count(bare.argv(SLURMD_MOUNTS))
    finally:
        bare.stop()
    print(
        json.dumps(
            {
                "benchmark": "local_cluster",
                "slots": 8,
                "public_slonk_fixed_sleep_seconds": 10,
                "slonk_local": ours,
                "slonk_local_without_its_epilog": no_epilog,
                "bare_pair": baseline,
                "ratio_latency_median": round(
                    ours["latency_ms_median"] / baseline["latency_ms_median"], 2
                ),
                "ratio_throughput_seconds": round(
                    ours["throughput_seconds"] / baseline["throughput_seconds"], 2
                ),
                "ratio_throughput_seconds_without_its_epilog": round(
                    no_epilog["throughput_seconds"] / baseline["throughput_seconds"], 2
                ),
                "ratio_array_seconds": round(
                    baseline["array_jobs_per_second"] / ours["array_jobs_per_second"], 2
                ),
                "ratio_array_seconds_without_its_epilog": round(
                    baseline["array_jobs_per_second"] / no_epilog["array_jobs_per_second"], 2
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
