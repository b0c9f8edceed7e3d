"""One scrape of the cluster exporter over 15,000 nodes and 100,000 jobs. Prints one JSON
document.

The `--json` documents are Slurm 24.11's own (tests/unit/data: real captures), their records
repeated with new names: nodes in 20 pools of 750, cycling through the captured nodes' states
and reasons with 8 GPUs each; jobs over two partitions, cycling through the captured running
and pending jobs with four pending reasons. sdiag is the captured document.

Measured, each the best of RUNS:
- `scrape`: what the exporter does per scrape after Slurm answered: parse the three documents,
  count, and render the exposition text (slonk.metrics.collector, prometheus_client);
- `json_loads_floor`: json.loads of the same three documents alone, the floor any exporter
  reading Slurm's JSON pays (there is no public Slonk exporter to run: public Slonk's ran
  `sinfo`/`squeue` text per scrape, a different input);
- peak memory of each (tracemalloc, in a run of its own: tracing slows a run), beyond the
  documents' text, which the exporter holds as Slurm's output.
Slurm's own time to print the documents (slurmctld with 15,000 nodes) is not in it.
"""

from __future__ import annotations

import copy
import gc
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from slonk.metrics.cluster import job_families, node_families
from slonk.metrics.collector import SourcesCollector
from slonk.metrics.sdiag import sdiag_families

DATA = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data"
NODES, POOLS, JOBS, RUNS = 15_000, 20, 100_000, 3
PARTITIONS = ("main", "all")
REASONS = ("Priority", "Resources", "ReqNodeNotAvail", "Dependency")


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def node_name(i: int) -> str:
    return f"slonk-gpu{i % POOLS:02d}-{i // POOLS}"


def nodes_document() -> str:
    shown = load("scontrol-show-node.json")
    templates = shown["nodes"]
    records = []
    for i in range(NODES):
        record = copy.deepcopy(templates[i % len(templates)])
        name = node_name(i)
        record.update(name=name, hostname=name, address=name)
        record["tres"] = f"{record['tres']},gres/gpu=8"
        record["tres_used"] = "gres/gpu=4" if record["alloc_cpus"] else ""
        records.append(record)
    shown["nodes"] = records
    return json.dumps(shown)


def jobs_document() -> str:
    shown = load("squeue.json")
    running, pending = shown["jobs"]
    records = []
    for i in range(JOBS):
        record = copy.deepcopy(running if i % 4 == 0 else pending)
        record.update(job_id=1000 + i, partition=PARTITIONS[i % 2])
        if record is not running and i % 4:
            record["state_reason"] = REASONS[i % len(REASONS)]
        if record["job_resources"]:
            record["job_resources"]["nodes"]["allocation"][0]["name"] = node_name(i % NODES)
            record["batch_host"] = record["nodes"] = node_name(i % NODES)
        records.append(record)
    shown["jobs"] = records
    return json.dumps(shown)


def best(runs: int, work: Callable[[], object]) -> float:
    seconds = float("inf")
    for _ in range(runs):
        gc.collect()
        started = time.perf_counter()
        work()
        seconds = min(seconds, time.perf_counter() - started)
    return seconds


def peak_bytes(work: Callable[[], object]) -> int:
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    work()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - base


def main() -> None:
    nodes, jobs = nodes_document(), jobs_document()
    sdiag = (DATA / "sdiag.json").read_text()
    pools = {node_name(i): f"gpu{i % POOLS:02d}" for i in range(NODES)}
    collector = SourcesCollector({
        "nodes": lambda: node_families(nodes, lambda n: pools.get(n, "")),
        "jobs": lambda: job_families(jobs, PARTITIONS),
        "sdiag": lambda: sdiag_families(sdiag),
    })  # fmt: skip
    registry = CollectorRegistry()
    registry.register(collector)
    exposition = generate_latest(registry)
    assert not any(collector.errors.values()), collector.errors

    def scrape() -> bytes:
        return generate_latest(registry)

    def floor() -> None:  # one document at a time, as the exporter reads them
        for document in (nodes, jobs, sdiag):
            json.loads(document)

    mib = 1024 * 1024
    print(json.dumps({
        "benchmark": "metrics",
        "nodes": NODES,
        "pools": POOLS,
        "jobs": JOBS,
        "documents_mib": {
            "scontrol_show_node": round(len(nodes) / mib, 1),
            "squeue": round(len(jobs) / mib, 1),
            "sdiag": round(len(sdiag) / mib, 3),
        },
        "scrape_seconds": round(best(RUNS, scrape), 3),
        "scrape_peak_mib": round(peak_bytes(scrape) / mib, 1),
        "json_loads_floor_seconds": round(best(RUNS, floor), 3),
        "json_loads_floor_peak_mib": round(peak_bytes(floor) / mib, 1),
        "exposition_bytes": len(exposition),
        "exposition_series": sum(
            1 for line in exposition.decode().splitlines() if line and not line.startswith("#")
        ),
        "baseline": "json.loads of the same three documents alone (no public Slonk exporter "
        "reads --json; public Slonk's ran sinfo/squeue text)",
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
