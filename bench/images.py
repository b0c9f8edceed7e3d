"""The images, measured in one run. Prints one JSON document.

- image sizes, as podman reports them (uncompressed), and beside them those of earlier images
  kept under another name, `bench/images.py PREFIX:TAG` for PREFIX/<role>:TAG (to compare a
  change of base);
- start to idle of a worker: `slonk local restart` of one worker pod until Slurm shows the
  node idle again, RESTARTS times, with the pod run by slonk itself over the image's layers
  (runtime host) and by podman; plus each cluster's `up`.
Run with the images built (scripts/build-images); SLONK_PODMAN names a podman wrapper where
the machine needs one (tests/images/podman-sandboxed here).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from slonk.base import paths
from slonk.local import cluster as local
from slonk.local.podman import podman

RESTARTS = 5
WORKER = "slonk-cpu-0"
VERSION = yaml.safe_load((paths.chart_dir() / "Chart.yaml").read_text())["appVersion"]


def sizes(prefix: str = "localhost/slonk", tag: str = VERSION) -> dict[str, float]:
    return {
        role: round(int(podman("image", "inspect", "--format", "{{.Size}}",
                               f"{prefix}/{role}:{tag}")) / 1e6, 1)
        for role in ("base", "controller", "worker", "login")
    }  # fmt: skip


def worker_start_to_idle(state: Path, runtime: str) -> dict:
    started = time.perf_counter()
    cluster = local.up(state, runtime=runtime, progress=lambda m: None)
    result: dict = {"up_to_idle_seconds": round(time.perf_counter() - started, 2)}
    seconds = []
    for _ in range(RESTARTS):
        started = time.perf_counter()
        local.restart(state, WORKER)
        while (node := local.node_states(cluster).get(WORKER)) is None or node.label != "idle":
            time.sleep(0.02)
        seconds.append(time.perf_counter() - started)
    log = (cluster.pod_dir(WORKER) / "log").read_text()
    init_ms = [
        int(line.split("ready in ")[1].split()[0])
        for line in log.splitlines()
        if "ready in" in line
    ]
    result["worker_restart_to_idle_seconds"] = {
        "median": round(statistics.median(seconds), 2),
        "max": round(max(seconds), 2),
    }
    result["worker_init_layer_ms"] = init_ms[-1]
    return result


def main() -> None:
    os.environ.setdefault("SLONK_PODMAN", "podman")
    result: dict = {"benchmark": "images", "image_mb": sizes()}
    if len(sys.argv) > 1:
        prefix, tag = sys.argv[1].rsplit(":", 1)
        result[f"image_mb_{sys.argv[1]}"] = sizes(prefix, tag)
    with tempfile.TemporaryDirectory(prefix="slonk-bench-images-") as tmp:
        for runtime in ("host", "podman"):
            state = Path(tmp) / runtime
            try:
                result[f"runtime_{runtime}"] = worker_start_to_idle(state, runtime)
            finally:
                local.down(state, purge=True, progress=lambda m: None)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
