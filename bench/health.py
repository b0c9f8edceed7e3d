"""Health checks, measured in one run. Prints one JSON document.

- per-job cost: 500 trivial jobs, one sbatch each and as one array (bench/local_cluster.py's
  workload), through the same one-worker cluster several ways: checks off and the Epilog
  dropped (no hooks either: slurm.conf names no Prolog/Epilog at all, which the run checks:
  bare Slurm, run first and again last, to show how much the machine drifts within the run);
  checks off with slonk's Epilog alone (it clears what each job's user left on the node,
  slonk.health.leftovers: on by default); default checks on a GPU
  pool (the worker's gpu check made to expect 2 GPUs, which a fake nvidia-smi shows) and on a
  CPU pool; the same GPU pool with its machine checks also in every job (`prolog` and
  `epilog` in their phases); and Prolog/Epilog that do nothing (/bin/true): what Slurm's
  forking them costs by itself. Ratios against the first bare run;
- the programs Slurm forks in the per-job column, through the same wrappers Slurm runs
  (dispatcher plus checks): prolog and epilog, ms per run, median and p99; the interval
  HealthCheckProgram, mean;
- fault to drain on the default GPU pool, where only the agent's watch (every
  health.watchSeconds) and the interval checks (every 300 s) look: /home remounted
  read-only on the worker, timed until Slurm shows the node drained, FAULTS times; healed and
  resumed in between.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from local_cluster import workload

from slonk.base import paths
from slonk.local import cluster as local

FAKE_GPU = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "fake-gpu"
FAULTS = 5
PROGRAM_RUNS = 200
WORKER = "slonk-cpu-1"
CONTROLLER = "slonk-controller-0"
GPU_CHECK = f'{{expectedCount: 2, nvidiaSmi: "{FAKE_GPU} nvidia-smi", dmesg: "{FAKE_GPU} dmesg"'
GPU_POOL = f"health: {{checks: {{gpu: {GPU_CHECK}}}}}}}\n"
CPU_POOL = "health: {enabled: true}\n"
# The GPU pool with the machine checks also run in every job, as before the watch phase.
PER_JOB = (
    f"health: {{checks: {{gpu: {GPU_CHECK}, phases: [boot, prolog, epilog, watch, interval]}},"
    " storage: {phases: [boot, prolog, watch, interval]},"
    " scratch: {phases: [boot, prolog, watch, interval]}}}\n"
)
SCRATCH_EPILOG = "health: {enabled: false}\n"  # slonk's Epilog, always named, alone
CHECKS_OFF = SCRATCH_EPILOG + "slurm: {slurmConf: {Epilog: null}}\n"
# Slurm's own cost of forking a Prolog and an Epilog at all: programs that do nothing.
EMPTY_PROGRAMS = SCRATCH_EPILOG + "slurm: {slurmConf: {Prolog: /bin/true, Epilog: /bin/true}}\n"


def program_ms(cluster: local.Cluster, program: str, runs: int) -> dict[str, float]:
    """Wall time of each of `runs` runs of a program slurm.conf names, inside the worker,
    as slurmd runs it (no terminal, output captured): median and p99 in ms."""
    timing = (
        "import subprocess,time,json\n"
        "ts=[]\n"
        f"for _ in range({runs}):\n"
        " t=time.perf_counter()\n"
        f" subprocess.run(['{program}'], capture_output=True, check=True)\n"
        " ts.append((time.perf_counter()-t)*1000)\n"
        "print(json.dumps(ts))\n"
    )
    out = cluster.run(WORKER, ["python3", "-c", timing])
    if out.returncode:
        raise RuntimeError(f"{program}: {out.stderr}")
    times = sorted(json.loads(out.stdout))
    return {
        "runs": runs,
        "median": round(statistics.median(times), 1),
        "p99": round(times[int(len(times) * 0.99) - 1], 1),
        "mean": round(statistics.fmean(times), 1),
    }


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


def job_programs(cluster: local.Cluster) -> list[str]:
    """What the cluster's slurm.conf names for Slurm to fork around jobs (bare Slurm: none)."""
    conf = str(paths.SLURMCTLD_CONF_DIR / "slurm.conf")
    out = cluster.run(CONTROLLER, ["cat", conf])
    if out.returncode:
        raise RuntimeError(f"{conf}: {out.stderr}")
    keys = ("prolog", "epilog", "taskprolog", "taskepilog")
    return [
        line.strip()
        for line in out.stdout.splitlines()
        if line.partition("=")[0].strip().lower() in keys
    ]


def run_cluster(tmp: Path, name: str, values: str, measure) -> dict:
    state = tmp / name
    values_file = state.with_suffix(".yaml")
    values_file.write_text(values)
    try:
        cluster = local.up(state, [values_file], progress=lambda m: None)
        result = {"job_programs": job_programs(cluster)}
        result.update(measure(cluster))
        return result
    finally:
        local.down(state, purge=True, progress=lambda m: None)


def jobs(cluster: local.Cluster) -> dict:
    return {"jobs": workload(cluster.ssh("demo", ["sh", "-s"]))}


def per_job(cluster: local.Cluster) -> dict:
    result = {
        "prolog_program_ms": program_ms(cluster, "/run/slonk/bin/prolog", PROGRAM_RUNS),
        "epilog_program_ms": program_ms(cluster, "/run/slonk/bin/epilog", PROGRAM_RUNS),
        "health_check_program_ms": program_ms(cluster, "/run/slonk/bin/health", 20)["mean"],
    }
    result.update(jobs(cluster))
    return result


def gpu_pool(cluster: local.Cluster) -> dict:
    result = jobs(cluster)
    drains = fault_to_drain(cluster)
    result["fault_to_drain_seconds"] = {
        "faults": FAULTS,
        "median": statistics.median(drains),
        "max": max(drains),
        "all": drains,
    }
    return result


def main() -> None:
    result: dict = {"benchmark": "health"}
    with tempfile.TemporaryDirectory(prefix="slonk-bench-health-") as tmp:
        columns = [
            ("bare_slurm_checks_off", CHECKS_OFF, jobs),
            ("scratch_epilog_alone", SCRATCH_EPILOG, jobs),
            ("gpu_pool_default_checks", GPU_POOL, gpu_pool),
            ("cpu_pool_default_checks", CPU_POOL, jobs),
            ("gpu_pool_checks_in_every_job", PER_JOB, per_job),
            ("empty_prolog_epilog", EMPTY_PROGRAMS, jobs),
            ("bare_slurm_checks_off_again", CHECKS_OFF, jobs),
        ]
        for name, values, measure in columns:
            result[name] = run_cluster(Path(tmp), name, values, measure)
    for name in ("bare_slurm_checks_off", "bare_slurm_checks_off_again"):
        if result[name]["job_programs"]:
            raise RuntimeError(f"checks off should leave bare Slurm: {result[name]}")
    for key in ("jobs_per_second", "array_jobs_per_second"):
        bare = result["bare_slurm_checks_off"]["jobs"][key]
        result[f"ratio_vs_bare_{key}"] = {
            name: round(result[name]["jobs"][key] / bare, 2) for name, _, _ in columns[1:]
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
