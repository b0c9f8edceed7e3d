"""slurmctld while active checks start on every node of a local cluster, in one run: the same
cluster (N one-GPU workers, fake GPUs; 32 by default) with `health.active` off, on at the
default `startsPerMinute` (30), on at 600 (a herd: every due node submitted in one pass), and
on at 30 with a check that spans a block besides (`/bin/true` over the pool's idle nodes, one
job: the pool is its group; slonk.align.fabric), whose gate holds each node until its first
run. With `intervalSeconds` at its least (10 s), every idle node is due again and again, so
the sampling window is a round after round. Prints one JSON document.

For SAMPLE_SECONDS after every node is idle, once a second from the controller pod: how long
`sinfo` and `scontrol ping` take (what users and the health checks feel); at the end, sdiag's
REQUEST_SUBMIT_BATCH_JOB count and mean time, its server thread and agent queue figures, and
how many check jobs ran, by name (`slonk-active` a node's, `slonk-fabric` a block's) and
state. Local mode's figures: two cores, every pod on them.
"""

from __future__ import annotations

import argparse
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

SAMPLE_SECONDS = 90
CONTROLLER = "slonk-controller-0"


BLOCK_CHECK = {"true": {"command": "/bin/true", "timeoutSeconds": 30, "span": "block"}}


def values(nodes: int, per_minute: int | None, block: bool = False) -> dict:
    active: dict = {"enabled": per_minute is not None}
    if per_minute is not None:
        active |= {"intervalSeconds": 10, "startsPerMinute": per_minute}
    if block:
        active["commands"] = BLOCK_CHECK
    return {
        "nodepools": {
            "cpu": None,
            "gpu": {"replicas": nodes, "cpus": 1, "memoryMiB": 512, "gpus": {"count": 1}},
        },
        "partitions": {"main": {"pools": ["gpu"]}},
        "accounting": {"enabled": False},
        "metrics": {"enabled": False},
        "syncer": {"enabled": False},
        "health": {"active": active},
    }


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False)
    return (time.perf_counter() - started) * 1000


def spread(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "p50": round(statistics.median(ordered), 1),
        "p90": round(ordered[int(len(ordered) * 0.9) - 1], 1),
        "max": round(ordered[-1], 1),
    }


def sdiag(text: str) -> dict:
    found = re.search(r"REQUEST_SUBMIT_BATCH_JOB\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)", text)
    threads = re.search(r"Server thread count:\s*(\d+)", text)
    queue = re.search(r"Agent queue size:\s*(\d+)", text)
    return {
        "submit_batch_job_count": int(found.group(1)) if found else 0,
        "submit_batch_job_ave_us": int(found.group(2)) if found else 0,
        "server_threads": int(threads.group(1)) if threads else None,
        "agent_queue": int(queue.group(1)) if queue else None,
    }


def run(nodes: int, per_minute: int | None, block: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="slonk-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values(nodes, per_minute, block)))
        started = time.time()
        cluster = local.up(state_dir, [path], progress=lambda m: None)
        up = time.time() - started
        try:
            in_controller = lambda *argv: cluster.enter(CONTROLLER, list(argv))  # noqa: E731
            subprocess.run(in_controller("sdiag", "--reset"), capture_output=True, check=False)
            sinfo, ping = [], []
            deadline = time.monotonic() + SAMPLE_SECONDS
            while time.monotonic() < deadline:
                sinfo.append(timed(in_controller("sinfo", "--noheader", "--format=%t")))
                ping.append(timed(in_controller("scontrol", "ping")))
                time.sleep(max(0.0, 1.0 - (sinfo[-1] + ping[-1]) / 1000))
            said = subprocess.run(
                in_controller("sdiag"), capture_output=True, text=True, check=True
            ).stdout
            checks = subprocess.run(
                in_controller(
                    "squeue", "--all", "--noheader", "--states=all",
                    "--partition=slonk-active", "--format=%j:%T",
                ),
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()  # fmt: skip
        finally:
            local.down(state_dir, purge=True, progress=lambda m: None)
    return {
        "up_to_idle_seconds": round(up, 1),
        "sinfo_ms": spread(sinfo),
        "scontrol_ping_ms": spread(ping),
        "sdiag": sdiag(said),
        "check_jobs": {state: checks.count(state) for state in sorted(set(checks))},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=32)
    nodes = parser.parse_args().nodes
    print(
        json.dumps(
            {
                "benchmark": "active_herd",
                "mode": f"slonk local: 2 cores, {nodes} one-GPU workers (fake GPUs)",
                "sample_seconds": SAMPLE_SECONDS,
                "active_off": run(nodes, None),
                "active_30_per_minute": run(nodes, 30),
                "active_600_per_minute": run(nodes, 600),
                "active_30_per_minute_and_a_block_check": run(nodes, 30, block=True),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
