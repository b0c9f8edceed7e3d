"""What the exporter serves, scraped once from Slurm 24.11's own captured JSON (tests/unit/data;
its jobs from squeue-gpu.json, whose running jobs hold GPUs)
and one record of each of slonk's own files: the series and labels other parts of the
project (the Grafana dashboard) may name."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slonk.health import history, runner
from slonk.metrics.cluster import job_families, node_families
from slonk.metrics.collector import SourcesCollector
from slonk.metrics.events import EventCounter, syncer_families
from slonk.metrics.gpus import gpu_families, nvlink_families
from slonk.metrics.health import health_families
from slonk.metrics.sdiag import sdiag_families

DATA = Path(__file__).parents[1] / "unit" / "data"
FAKE_GPU = Path(__file__).parents[1] / "fakes" / "fake-gpu"


def _render(collector: SourcesCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def scrapes() -> tuple[str, str]:
    """(the controller's exposition, a worker's)."""
    text = lambda name: (DATA / name).read_text()  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        stats = state / "syncer-stats.json"
        stats.write_text(json.dumps({"passes": 1, "errors": 0, "actions": {"drain": 1}}))
        events = EventCounter(state / "history.jsonl")
        controller = SourcesCollector({
            "nodes": lambda: node_families(text("scontrol-show-node.json"), lambda n: "cpu"),
            "jobs": lambda: job_families(text("squeue-gpu.json"), {"main"}, lambda n: "gpu"),
            "sdiag": lambda: sdiag_families(text("sdiag.json")),
            "history": events.families,
            "syncer": lambda: syncer_families(stats),
        }, fresh=0)  # fmt: skip
        _render(controller)  # the counter starts at the history's end
        history.append([history.Event(time=1.0, event="drain", node="n", cause="gpu")], events.path)
        result = {"check": "dns", "ok": True, "detail": "", "seconds": 0.1, "time": 1.0}
        runner.results_path("interval", state).write_text(json.dumps([result]))
        plan = state / "plan.json"
        gpu = {
            "phases": ["boot"],
            "timeoutSeconds": 10,
            "options": {"nvidiaSmi": f"{FAKE_GPU} nvidia-smi", "nvml": f"{FAKE_GPU} nvml"},
        }
        plan.write_text(json.dumps({
            "node": {"name": "n1", "gpus": 2, "peers": ["n1"]}, "undrain": True,
            "checks": {"gpu": gpu}, "watch_seconds": 5,
        }))  # fmt: skip
        worker = SourcesCollector({
            "health": lambda: health_families(state, "n1"),
            "gpus": lambda: gpu_families("n1", plan),
            "nvlink": lambda: nvlink_families("n1", plan),
        }, fresh=0)  # fmt: skip
        return _render(controller), _render(worker)


@cache
def served_series() -> dict[str, frozenset[str]]:
    """{series name: its label names} across the controller's and a worker's scrape."""
    series: dict[str, frozenset[str]] = {}
    for exposition in scrapes():
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                series[sample.name] = series.get(sample.name, frozenset()) | frozenset(
                    sample.labels
                )
    return series
