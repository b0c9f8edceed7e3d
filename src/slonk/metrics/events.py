"""Counters from slonk's own records on the controller: node events from the node history
(slonk.health.history, since the exporter started) and the syncer's stats file."""

from __future__ import annotations

from pathlib import Path

from slonk.health import history
from slonk.metrics.cause import CAUSES, cause_label
from slonk.metrics.family import COUNTER, Family, RecordError, number, read_record

EVENTS = ("drain", "resume", "recycle", "quarantine")
SYNCER_ACTIONS = ("drain", "resume", "down", "lend", "give-back")
MAX_STATS_BYTES = 64 * 1024  # the syncer's file is a few hundred bytes


class EventCounter:
    """slonk_node_events_total{event,cause}: the history's events since the exporter first
    read it, every event and cause shown from 0 so that a first event is an increase."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset: int | None = None
        self.counts: dict[tuple[str, ...], float] = {
            (event, cause): 0.0 for event in EVENTS for cause in sorted(CAUSES)
        }

    def update(self) -> None:
        if self.offset is None:  # its past belongs to earlier exporters
            self.offset = history.end(self.path)
        events, self.offset = history.follow(self.path, self.offset)
        for event in events:
            if event.event not in EVENTS:
                continue
            cause = event.cause
            if cause not in CAUSES:  # never a label the cause set does not hold
                cause = cause_label(event.reason)
            self.counts[event.event, cause] += 1

    def families(self) -> list[Family]:
        self.update()
        family = Family("slonk_node_events_total", COUNTER, "Node drains, resumes, recycles "
                        "and quarantines since the exporter started, by cause.",
                        ("event", "cause"))  # fmt: skip
        family.samples.update(self.counts)
        return [family]


def syncer_families(path: Path) -> list[Family]:
    """slonk_syncer_passes_total, _errors_total, _actions_total{action}: none while the
    syncer has written no stats (it is off, or has not finished a pass)."""
    try:
        stats = read_record(path, MAX_STATS_BYTES)
    except FileNotFoundError:
        return []
    if not isinstance(stats, dict):
        raise RecordError(f"{path}: not a JSON object")
    passes = Family("slonk_syncer_passes_total", COUNTER, "Syncer passes since it started.")
    passes.set(number(stats.get("passes")))
    errors = Family("slonk_syncer_errors_total", COUNTER, "Syncer passes that failed since "
                    "it started.")  # fmt: skip
    errors.set(number(stats.get("errors")))
    actions = Family("slonk_syncer_actions_total", COUNTER, "What the syncer did to nodes "
                     "since it started.", ("action",))  # fmt: skip
    done = stats.get("actions")
    done = done if isinstance(done, dict) else {}
    for action in SYNCER_ACTIONS:
        actions.set(number(done.get(action)), action)
    return [passes, errors, actions]
