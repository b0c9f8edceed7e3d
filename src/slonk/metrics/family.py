"""A metric family as plain data: what each source reads, before prometheus_client (imported
by slonk.metrics.collector alone) renders it. Keeps the readers testable and the benchmark
able to time reading apart from rendering."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slonk.base.errors import SlonkError

GAUGE, COUNTER = "gauge", "counter"


@dataclass
class Family:
    name: str  # counters end in `_total`
    kind: str  # GAUGE or COUNTER
    help: str
    labels: tuple[str, ...] = ()
    samples: dict[tuple[str, ...], float] = field(default_factory=dict)

    def add(self, value: float, *labels: str) -> None:
        self.samples[labels] = self.samples.get(labels, 0.0) + value

    def set(self, value: float, *labels: str) -> None:
        self.samples[labels] = value


def number(value: object, limit: float = 2.0**63) -> float:
    """A count Slurm printed, as a float: a JSON int or float within [0, limit], else 0. A
    field missing or of the wrong type counts nothing rather than losing the others."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if 0 <= value <= limit else 0.0


def slurm_number(value: object) -> float:
    """Slurm's {set, infinite, number} form, or a bare number."""
    if isinstance(value, dict):
        if value.get("set") is False or value.get("infinite") is True:
            return 0.0
        return number(value.get("number"))
    return number(value)


class RecordError(SlonkError):
    """A record slonk keeps (a results or stats file) cannot be read."""


class PartialError(RecordError):
    """Some of a source's records could not be read: `families` hold the rest, still served."""

    def __init__(self, message: str, families: list[Family]) -> None:
        super().__init__(message)
        self.families = families


def read_record(path: Path, limit: int) -> Any:
    """The JSON document of a file slonk keeps, read no further than `limit` bytes; a
    RecordError when it is larger or not JSON (FileNotFoundError left to the caller)."""
    with path.open("rb") as file:
        raw = file.read(limit + 1)
    if len(raw) > limit:
        raise RecordError(f"{path}: larger than {limit} bytes")
    try:
        return json.loads(raw)
    except ValueError as err:
        raise RecordError(f"{path}: not JSON ({err})") from None
