"""A worker's health checks as metrics: the last results of each phase, as slonk.health.runner
writes them (HEALTH_STATE/results-<phase>.json)."""

from __future__ import annotations

from pathlib import Path

from slonk.config.model import CHECK_PHASES
from slonk.health.runner import results_path
from slonk.metrics.cause import CHECKS
from slonk.metrics.family import GAUGE, Family, PartialError, RecordError, number, read_record

MAX_RESULTS_BYTES = 1024 * 1024


def health_families(state: Path, node: str) -> list[Family]:
    """slonk_health_check_ok, _duration_seconds, _last_run_timestamp_seconds{node,check,phase}.
    `node` is this pod's name; checks slonk does not ship and phases it does not run are left
    out, so no label comes from the files' text."""
    labels = ("node", "check", "phase")
    ok = Family("slonk_health_check_ok", GAUGE, "Whether the check passed on its last run "
                "(1) or failed (0).", labels)  # fmt: skip
    duration = Family("slonk_health_check_duration_seconds", GAUGE, "How long the check's "
                      "last run took.", labels)  # fmt: skip
    last = Family("slonk_health_check_last_run_timestamp_seconds", GAUGE, "When the check "
                  "last ran, in seconds since the epoch.", labels)  # fmt: skip
    problems = []
    for phase in CHECK_PHASES:
        path = results_path(phase, state)
        try:
            results = _read(path)
        except FileNotFoundError:
            continue
        except RecordError as err:
            problems.append(str(err))
            continue
        for result in results:
            check = result.get("check") if isinstance(result, dict) else None
            if check not in CHECKS:
                continue
            assert isinstance(result, dict) and isinstance(check, str)
            ok.set(1.0 if result.get("ok") is True else 0.0, node, check, phase)
            duration.set(number(result.get("seconds")), node, check, phase)
            last.set(number(result.get("time")), node, check, phase)
    if problems:  # the good phases are served; the error is counted
        raise PartialError("; ".join(problems), [ok, duration, last])
    return [ok, duration, last]


def _read(path: Path) -> list[object]:
    results = read_record(path, MAX_RESULTS_BYTES)
    if not isinstance(results, list):
        raise RecordError(f"{path}: not a JSON list")
    return results
