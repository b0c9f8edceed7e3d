"""Rendering at scale: 15,000 Slurm nodes in 20 pools. Prints one JSON document.

Measures the chart's cluster.yaml against the 1 MiB ConfigMap limit, `slonk render-config`,
and `slonk chart template` (time and object count), each the best of a few runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

CONFIGMAP_LIMIT = 1024 * 1024
POOLS, NODES = 20, 15_000


def values() -> dict:
    per_pool = NODES // POOLS
    pools = {
        f"gpu{i:02d}": {
            "replicas": per_pool,
            "cpus": 96,
            "memoryMiB": 1_048_576,
            "gpus": {"count": 8, "type": "h100"},
            "features": ["h100", f"rack{i}"],
            "topology": {"switch": f"leaf{i // 2}", "block": f"block{i // 4}"},
        }
        for i in range(POOLS)
    }
    partitions = {"main": None, "all": {"pools": sorted(pools), "default": True}}
    return {"nodepools": {"cpu": None, **pools}, "partitions": partitions}


def best_of(runs: int, command: list[str]) -> tuple[float, bytes]:
    best, out = float("inf"), b""
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(command, check=True, capture_output=True).stdout
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    slonk = [sys.executable, "-m", "slonk.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(yaml.safe_dump(values()))
        chart_s, manifest = best_of(3, [*slonk, "chart", "template", "-f", str(values_file)])
        docs = [d for d in yaml.load_all(manifest, Loader=yaml.CSafeLoader) if d]
        configmap = next(d for d in docs if d["kind"] == "ConfigMap")
        cluster_yaml = configmap["data"]["cluster.yaml"]
        cluster_file = Path(tmp) / "cluster.yaml"
        cluster_file.write_text(cluster_yaml)
        out = Path(tmp) / "etc"
        render_s, _ = best_of(
            5, [*slonk, "render-config", "--cluster", str(cluster_file), "--out", str(out)]
        )
        kinds: dict[str, int] = {}
        for doc in docs:
            kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
        print(
            json.dumps(
                {
                    "benchmark": "render_scale",
                    "nodes": NODES,
                    "pools": POOLS,
                    "cluster_yaml_bytes": len(cluster_yaml.encode()),
                    "configmap_limit_bytes": CONFIGMAP_LIMIT,
                    "cluster_yaml_share_of_limit": round(
                        len(cluster_yaml.encode()) / CONFIGMAP_LIMIT, 4
                    ),
                    "render_config_seconds": round(render_s, 3),
                    "slurm_conf_bytes": (out / "slurm.conf").stat().st_size,
                    "chart_template_seconds": round(chart_s, 3),
                    "chart_objects": len(docs),
                    "chart_objects_by_kind": kinds,
                    "manifest_bytes": len(manifest),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
