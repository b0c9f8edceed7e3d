"""Active checks on a cluster where users' jobs wait, in one run: a baseline commit's code and
this checkout's, each on the same local cluster (three one-GPU workers, fake GPUs, checks every
10 s) with the same queue: a job holding one node, and one asking for all three that waits for
it. Two nodes stay idle. While a job waits in the users' partition (a higher tier), Slurm's
main scheduler passes over the checks' partition and only its backfill scheduler starts a
check (bf_interval, 30 s by default). Counts the check jobs Slurm shows by state after
SAMPLE_SECONDS. Prints one JSON document.

    .venv/bin/python bench/active_queue.py --baseline c15edeb

The baseline runs from a `git worktree` of that commit (its pods bind its code, as a checkout's
do) with the images its chart names, which must exist (scripts/build-images at that commit).
Local mode's figures: two cores, every pod on them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SAMPLE_SECONDS = 150
CONTROLLER = "slonk-controller-0"
REPO = Path(__file__).resolve().parents[1]


def values() -> dict:
    return {
        "nodepools": {
            "cpu": None,
            "gpu": {"replicas": 3, "cpus": 2, "memoryMiB": 1024, "gpus": {"count": 1}},
        },
        "partitions": {"main": {"pools": ["gpu"]}},
        "accounting": {"enabled": False},
        "metrics": {"enabled": False},
        "syncer": {"enabled": False},
        "health": {"active": {"intervalSeconds": 10, "startsPerMinute": 60}},
    }


def one() -> dict:
    """This interpreter's slonk on its own cluster: the check jobs by state."""
    import slonk
    from slonk.local import cluster as local

    with tempfile.TemporaryDirectory(prefix="slonk-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values()))
        cluster = local.up(state_dir, [path], progress=lambda m: None)
        try:

            def run(*argv: str) -> str:
                done = subprocess.run(
                    cluster.enter(CONTROLLER, list(argv)), capture_output=True, text=True
                )
                return done.stdout

            holder = run(
                "sbatch", "--parsable", "--partition=main", "--nodelist=slonk-gpu-0",
                "--wrap=sleep 900",
            ).strip()  # fmt: skip
            deadline = time.monotonic() + 120
            while run("squeue", "--noheader", f"--jobs={holder}", "--format=%T").strip() != (
                "RUNNING"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {holder} did not start")
                time.sleep(1)
            run("sbatch", "--partition=main", "--nodes=3", "--exclusive", "--wrap=true")
            time.sleep(SAMPLE_SECONDS)
            queue = run("squeue", "--noheader", "--all", "--states=all", "--format=%P %T %r")
            checks = run(
                "squeue", "--noheader", "--all", "--states=all",
                "--partition=slonk-active", "--format=%T",
            ).split()  # fmt: skip
        finally:
            local.down(state_dir, purge=True, progress=lambda m: None)
    return {
        "code": str(Path(slonk.__file__).parent),
        "users_jobs": [line for line in queue.splitlines() if line.startswith("main ")],
        "check_jobs": {state: checks.count(state) for state in sorted(set(checks))},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", help="a commit whose code runs first, the same way")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one()))
        return
    result: dict = {"benchmark": "active_queue", "sample_seconds": SAMPLE_SECONDS}
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="slonk-base-") as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.baseline],
                check=True,
                capture_output=True,
            )
            try:
                env = {**os.environ, "PYTHONPATH": str(tree / "src")}
                done = subprocess.run(
                    [sys.executable, __file__, "--one"], env=env, capture_output=True, text=True
                )
                result["baseline"] = (
                    json.loads(done.stdout) if done.returncode == 0 else done.stderr[-2000:]
                )
                result["baseline_commit"] = args.baseline
            finally:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )
    result["ours"] = one()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
