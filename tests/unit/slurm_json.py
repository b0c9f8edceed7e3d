"""Slurm 24.11's JSON for unit tests: the real documents captured in data/ (see its README),
and records made from a real one, so that every shape is Slurm's own."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")


def text(name: str) -> str:
    return (DATA / name).read_text()


def document(name: str) -> dict[str, Any]:
    return json.loads(text(name))


def node(name: str, state: list[str], reason: str = "", started: int = 1795354690) -> dict:
    """A node record: the real idle node n4 of scontrol-show-node.json, changed."""
    (record,) = [n for n in document("scontrol-show-node.json")["nodes"] if n["name"] == "n4"]
    record = copy.deepcopy(record)
    record.update(name=name, hostname=name, state=state, reason=reason)
    record["slurmd_start_time"]["number"] = started
    return record


def nodes(*records: dict) -> str:
    """`scontrol show node --json` holding these records."""
    shown = document("scontrol-show-node.json")
    shown["nodes"] = list(records)
    return json.dumps(shown)
