"""One scrape of the cluster exporter over 15,000 nodes and 100,000 jobs. Prints one JSON
document.

The `--json` documents are Slurm 24.11's own, whole (tests/unit/data/*-full.json, captured
from a local cluster: two nodes, two running and two pending jobs), their records repeated
with new names: nodes in 20 pools of 750, cycling through the captured nodes' states and
reasons, 8 GPUs each; jobs over two partitions, a quarter running, the rest pending for four
reasons. sdiag is the captured document. They are written to files first, and each
measurement runs in a fresh Python that reads them, as the exporter holds Slurm's output.

Measured (seconds: best of RUNS; memory: the child's peak RSS (VmHWM, reset once the documents
were read) beyond its RSS then):
- `scrape`: what the exporter does per scrape once Slurm has answered: parse the three
  documents, count, and render the exposition text (slonk.metrics, prometheus_client);
- `json_loads_baseline`: json.loads of the same documents, one at a time, and nothing else:
  what any exporter that loads Slurm's JSON whole pays before it counts anything. There is
  no public Slonk exporter to run (public Slonk's ran `sinfo`/`squeue` text per scrape, a
  different input), so this is the baseline. slonk.slurm.slurm_state keeps only the fields read
  of each record as it parses (an object hook), so the scrape can cost less than it.
Slurm's own time to print the documents (slurmctld with 15,000 nodes) is not in it.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data"
NODES, POOLS, JOBS, RUNS = 15_000, 20, 100_000, 3
PARTITIONS = ("main", "all")
REASONS = ("Priority", "Resources", "ReqNodeNotAvail", "Dependency")
MIB = 1024 * 1024


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def node_name(i: int) -> str:
    return f"slonk-gpu{i % POOLS:02d}-{i // POOLS}"


def write_records(path: Path, shown: dict[str, Any], key: str, records: Any) -> None:
    """The document `shown` with `key` holding `records`, written one record at a time."""
    head = json.dumps({key: []} | {k: v for k, v in shown.items() if k != key})
    with path.open("w") as out:
        out.write(head[: head.index("[") + 1])
        for i, record in enumerate(records):
            out.write(("," if i else "") + json.dumps(record))
        out.write(head[head.index("[") + 1 :])


def nodes(shown: dict[str, Any]) -> Any:
    templates = shown["nodes"]
    for i in range(NODES):
        record = copy.deepcopy(templates[i % len(templates)])
        name = node_name(i)
        record.update(name=name, hostname=name, address=name)
        record["tres"] = f"{record['tres']},gres/gpu=8"
        record["tres_used"] = f"{record['tres_used']},gres/gpu=8" if record["alloc_cpus"] else ""
        yield record


def jobs(shown: dict[str, Any]) -> Any:
    running = next(j for j in shown["jobs"] if j["job_state"] == ["RUNNING"])
    pending = next(j for j in shown["jobs"] if j["job_state"] == ["PENDING"])
    for i in range(JOBS):
        record = copy.deepcopy(running if i % 4 == 0 else pending)
        record.update(job_id=1000 + i, partition=PARTITIONS[i % 2])
        if i % 4:
            record["state_reason"] = REASONS[i % len(REASONS)]
        else:
            name = node_name(i % NODES)
            record["job_resources"]["nodes"]["allocation"][0]["name"] = name
            record.update(batch_host=name, nodes=name)
        yield record


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


def child(what: str, files: list[str]) -> None:
    """One measurement, in a fresh Python (`--measure WHAT NODES JOBS SDIAG`): prints
    {seconds, peak_mib} and, for a scrape, what it served."""
    import gc
    import time

    texts = [Path(f).read_text() for f in files]
    collector = None
    if what == "scrape":
        from prometheus_client import CollectorRegistry, generate_latest

        from slonk.metrics.cluster import job_families, node_families
        from slonk.metrics.collector import SourcesCollector
        from slonk.metrics.sdiag import sdiag_families

        pools = {node_name(i): f"gpu{i % POOLS:02d}" for i in range(NODES)}
        collector = SourcesCollector(
            {
                "nodes": lambda: node_families(texts[0], lambda n: pools.get(n, "")),
                "jobs": lambda: job_families(texts[1], PARTITIONS, lambda n: pools.get(n, "")),
                "sdiag": lambda: sdiag_families(texts[2]),
            },
            deadline=3600,
            fresh=0,
        )  # every run reads Slurm again, and none is cut short
        registry = CollectorRegistry()
        registry.register(collector)

        def work() -> bytes:
            return generate_latest(registry)
    else:

        def work() -> bytes:
            for text in texts:
                json.loads(text)
            return b""

    gc.collect()
    # The peak (VmHWM) starts again from here: reading the files is not counted.
    Path("/proc/self/clear_refs").write_text("5")
    base = status_kib("VmRSS")
    best = float("inf")
    for _ in range(RUNS):
        gc.collect()
        started = time.perf_counter()
        out = work()
        best = min(best, time.perf_counter() - started)
    result: dict[str, Any] = {
        "seconds": round(best, 3),
        "peak_mib": round((status_kib("VmHWM") - base) / 1024, 1),
    }
    if collector is not None:
        assert not any(collector.errors.values()), collector.errors
        lines = out.decode().splitlines()
        result["exposition_bytes"] = len(out)
        result["series"] = sum(1 for line in lines if line and not line.startswith("#"))
    print(json.dumps(result))


def measure(what: str, files: list[Path]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--measure", what, *map(str, files)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="slonk-bench-metrics-") as tmp:
        files = [Path(tmp) / name for name in ("nodes.json", "squeue.json", "sdiag.json")]
        write_records(files[0], (shown := load("scontrol-show-node-full.json")), "nodes",
                      nodes(shown))  # fmt: skip
        write_records(files[1], (shown := load("squeue-full.json")), "jobs", jobs(shown))
        files[2].write_text((DATA / "sdiag.json").read_text())
        sizes = {f.stem: round(f.stat().st_size / MIB, 1) for f in files}
        scrape = measure("scrape", files)
        baseline = measure("baseline", files)
    print(json.dumps({
        "benchmark": "metrics",
        "nodes": NODES,
        "pools": POOLS,
        "jobs": JOBS,
        "documents_mib": sizes,
        "scrape_seconds": scrape["seconds"],
        "scrape_peak_mib_beyond_documents": scrape["peak_mib"],
        "json_loads_baseline_seconds": baseline["seconds"],
        "json_loads_baseline_peak_mib_beyond_documents": baseline["peak_mib"],
        "exposition_bytes": scrape["exposition_bytes"],
        "exposition_series": scrape["series"],
        "baseline": "json.loads of the same documents alone, one at a time (no public Slonk "
        "exporter reads --json; public Slonk's ran sinfo/squeue text)",
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        child(sys.argv[2], sys.argv[3:])
    else:
        main()
