"""The prometheus_client side: a Collector that reads every source once per scrape, counts a
source that fails and serves the others. The one module that imports prometheus_client."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slonk.metrics.family import COUNTER, Family, PartialError

Source = Callable[[], list[Family]]


def log(message: str) -> None:
    print(f"slonk metrics: {message}", file=sys.stderr, flush=True)


def metric(family: Family) -> Metric:
    kind = CounterMetricFamily if family.kind == COUNTER else GaugeMetricFamily
    rendered = kind(family.name, family.help, labels=list(family.labels))
    for labels, value in family.samples.items():
        rendered.add_metric(list(labels), value)
    return rendered


class SourcesCollector(Collector):
    """Every source's families, then slonk_exporter_scrape_duration_seconds and
    slonk_exporter_scrape_errors_total{source} (each source shown from 0)."""

    def __init__(self, sources: Mapping[str, Source]) -> None:
        self.sources = dict(sources)
        self.errors = dict.fromkeys(self.sources, 0.0)
        # One scrape at a time: the HTTP server answers each request in a thread, and two
        # scrapes at once would ask Slurm twice and race on the counts.
        self.lock = threading.Lock()

    def read(self) -> list[Family]:
        families: list[Family] = []
        for name, source in self.sources.items():
            try:
                families += source()
            except PartialError as err:
                families += err.families
                self._failed(name, err)
            except Exception as err:  # any failure of one source leaves the others served
                self._failed(name, err)
        return families

    def _failed(self, source: str, err: Exception) -> None:
        self.errors[source] += 1
        log(f"{source}: {str(err)[:500]!a}" if str(err) else f"{source}: {err!r}")

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            started = time.perf_counter()
            families = self.read()
            errors = dict(self.errors)
            took = time.perf_counter() - started
        for family in families:
            yield metric(family)
        counted = CounterMetricFamily(
            "slonk_exporter_scrape_errors", "Scrapes in which a source failed, by source.",
            labels=["source"],
        )  # fmt: skip
        for source, count in errors.items():
            counted.add_metric([source], count)
        yield counted
        yield GaugeMetricFamily(
            "slonk_exporter_scrape_duration_seconds", "How long reading every source took.",
            value=took,
        )  # fmt: skip
