"""The prometheus_client side: a Collector that reads every source once per scrape, counts a
source that fails and serves the others. The one module that imports prometheus_client."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, wait

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


# One scrape reads every source at once and waits this long at most: under Prometheus'
# default scrape timeout (10 s), so that a hung slurmctld (each Slurm command may take 10 s)
# still leaves a scrape that says which source failed.
DEADLINE_SECONDS = 8.0
# A scrape this recent is served again: requests, whoever sends them and however many, never
# ask Slurm more often than this (a request that waited on a scrape gets its result).
FRESH_SECONDS = 5.0


def _started(source: Source) -> Future[list[Family]]:
    """The source read in a thread of its own: a daemon, as one stuck in Slurm or on a hung
    volume must not hold the process (`slonk metrics show`) at exit."""
    future: Future[list[Family]] = Future()

    def run() -> None:
        try:
            future.set_result(source())
        except BaseException as err:  # handed to the scrape, which counts it
            future.set_exception(err)

    threading.Thread(target=run, name="metrics-source", daemon=True).start()
    return future


class SourcesCollector(Collector):
    """Every source's families, then slonk_exporter_scrape_duration_seconds and
    slonk_exporter_scrape_errors_total{source} (each source shown from 0)."""

    def __init__(
        self,
        sources: Mapping[str, Source],
        deadline: float = DEADLINE_SECONDS,
        fresh: float = FRESH_SECONDS,
    ) -> None:
        self.sources = dict(sources)
        self.deadline, self.fresh = deadline, fresh
        self.errors = dict.fromkeys(self.sources, 0.0)
        # One scrape at a time: the HTTP server answers each request in a thread.
        self.lock = threading.Lock()
        self.reading: dict[str, Future[list[Family]]] = {}  # each source's last read
        self.served: tuple[float, list[Family], dict[str, float], float] | None = None

    def read(self) -> list[Family]:
        """Every source at once: a source still reading when the deadline comes (or since an
        earlier scrape: it is never read twice at once) is counted as failed, the others
        served."""
        late = {name for name, future in self.reading.items() if not future.done()}
        for name, source in self.sources.items():
            if name not in late:
                self.reading[name] = _started(source)
        wait([self.reading[n] for n in self.sources if n not in late], timeout=self.deadline)
        families: list[Family] = []
        for name in self.sources:
            future = self.reading[name]
            if name in late or not future.done():
                self._failed(name, f"still reading after {self.deadline:g} s")
                continue
            try:
                families += future.result()
            except PartialError as err:
                families += err.families
                self._failed(name, err)
            except Exception as err:  # any failure of one source leaves the others served
                self._failed(name, err)
        return families

    def _failed(self, source: str, err: Exception | str) -> None:
        self.errors[source] += 1
        log(f"{source}: {str(err)[:500]!a}" if str(err) else f"{source}: {err!r}")

    def scrape(self) -> tuple[list[Family], dict[str, float], float]:
        """The families, the error counts and how long reading took: read now, or the last
        scrape's when it is fresh."""
        with self.lock:
            now = time.monotonic()
            if self.served is None or now - self.served[0] >= self.fresh:
                families = self.read()
                done = time.monotonic()  # fresh from here: requests that waited share it
                self.served = (done, families, dict(self.errors), done - now)
            return self.served[1], self.served[2], self.served[3]

    def collect(self) -> Iterator[Metric]:
        families, errors, took = self.scrape()
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
