"""`slonk chart template` at 15,000 nodes in 20 pools, against public Slonk's chart: the same
node count rendered by the same Helm library in the same process. Prints one JSON document.

Timings per chart, each the best of RUNS runs taken in turns (the machine is shared): `render`
is Helm's library alone (load the chart, render its templates: `slonk.kube.chart.render`),
`template` adds what `slonk chart template` does after it (split, order and print the
manifest: `slonk.kube.chart.manifest`), and `render_no_nodes` renders the same pools at 0 replicas
(what the chart costs whatever the node count). Bytes are those of the printed manifest, as
`helm template` prints it. The public column is left out where ../shared (the public chart)
is absent.

The public chart has no values.schema.json; ours has one, and Helm compiles it (checking it
against JSON Schema's metaschema first) and validates the values on every render.
`render_without_schema` renders a copy of our chart without that file: the public chart's
work, so the two render ratios tell the schema's cost from the templates'.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from render_scale import NODES, POOLS, values

from slonk.kube import chart

RUNS = 9
REPO = Path(__file__).resolve().parents[1]
PUBLIC_CHART = REPO.parent / "shared" / "anchors" / "slonk-public-chart"


def public_values() -> dict[str, Any]:
    """The same nodes as render_scale.values() in the public chart's values: 20 compute pools
    of 750 GPU nodes; its default `cpu` pool removed, as ours is."""
    pools = {
        f"gpu{i:02d}": {
            "isSlurmComputeNode": True,
            "replicas": NODES // POOLS,
            "slurmConfig": {
                "CPUs": 96,
                "RealMemory": 1_048_576,
                "Gres": "gpu:8",
                "Features": ["h100", f"rack{i}"],
            },
            "resources": {"limits": {"cpu": 96, "memory": "1Ti", "nvidia.com/gpu": 8}},
        }
        for i in range(POOLS)
    }
    return {"nodepools": {"cpu": None, **pools}}


def without_nodes(chart_values: dict[str, Any]) -> dict[str, Any]:
    pools = {
        name: pool and {**pool, "replicas": 0} for name, pool in chart_values["nodepools"].items()
    }
    return {**chart_values, "nodepools": pools}


class Column:
    """One chart's timings and manifest."""

    def __init__(self, chart_dir: Path, chart_values: dict[str, Any]) -> None:
        self.chart_dir, self.values = chart_dir, chart_values
        self.render_s = self.template_s = self.no_nodes_s = float("inf")
        self.manifest = ""
        self.unschemed: Path | None = None
        self.unschemed_s = float("inf")

    def run(self) -> None:
        start = time.perf_counter()
        rendered = chart.render(self.chart_dir, self.values)
        rendered_at = time.perf_counter()
        self.manifest = chart.manifest(rendered)
        end = time.perf_counter()
        chart.render(self.chart_dir, without_nodes(self.values))
        self.no_nodes_s = min(self.no_nodes_s, time.perf_counter() - end)
        if self.unschemed is not None:
            begun = time.perf_counter()
            chart.render(self.unschemed, self.values)
            self.unschemed_s = min(self.unschemed_s, time.perf_counter() - begun)
        self.render_s = min(self.render_s, rendered_at - start)
        self.template_s = min(self.template_s, end - start)

    def report(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for _, doc in chart.documents({"all": self.manifest}):
            kind = chart.kind_of(doc)
            kinds[kind] = kinds.get(kind, 0) + 1
        return {
            "render_seconds": round(self.render_s, 4),
            "template_seconds": round(self.template_s, 4),
            "render_no_nodes_seconds": round(self.no_nodes_s, 4),
            **(
                {"render_without_schema_seconds": round(self.unschemed_s, 4)}
                if self.unschemed is not None
                else {}
            ),
            "manifest_bytes": len(self.manifest.encode()),
            "objects_by_kind": kinds,
        }


def best_in_turns(columns: dict[str, Column], runs: int) -> None:
    steps: list[Callable[[], None]] = [column.run for column in columns.values()]
    for _ in range(runs):
        for step in steps:
            step()


def without_schema(chart_dir: Path, scratch: Path) -> Path:
    copy = scratch / chart_dir.name
    shutil.copytree(chart_dir, copy)
    (copy / "values.schema.json").unlink()
    return copy


def main() -> None:
    ours = Column(chart.default_chart(), values())
    columns = {"slonk": ours}
    if PUBLIC_CHART.is_dir():
        columns["public"] = Column(PUBLIC_CHART, public_values())
    with tempfile.TemporaryDirectory() as scratch:
        ours.unschemed = without_schema(ours.chart_dir, Path(scratch))
        best_in_turns(columns, RUNS)
    result: dict[str, Any] = {
        "benchmark": "chart_render",
        "nodes": NODES,
        "pools": POOLS,
        "runs": RUNS,
        **{name: column.report() for name, column in columns.items()},
    }
    if "public" in columns:
        public = columns["public"]
        result["ratio"] = {
            "render": round(ours.render_s / public.render_s, 2),
            "render_without_schema": round(ours.unschemed_s / public.render_s, 2),
            "template": round(ours.template_s / public.template_s, 2),
            "manifest_bytes": round(len(ours.manifest.encode()) / len(public.manifest.encode()), 2),
        }
    else:
        result["public"] = f"skipped: {PUBLIC_CHART} is absent"
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
