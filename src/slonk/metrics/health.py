"""A worker's health checks as metrics: the last results of each phase, as slonk.health.runner
writes them (HEALTH_STATE/results-<phase>.json)."""

from __future__ import annotations

import re
from pathlib import Path

from slonk.config import active_checks, check_names
from slonk.config.model import CHECK_PHASES
from slonk.health.runner import results_path
from slonk.metrics.cause import CHECKS
from slonk.metrics.family import GAUGE, Family, PartialError, RecordError, number, read_record

MAX_RESULTS_BYTES = 1024 * 1024
# A site's own active checks (health.active.commands): named in the shape the spec allows.
SITE_CHECK = re.compile(check_names.ACTIVE_PREFIX + active_checks.COMMAND_NAME.strip("^$"))


def served(check: object, sites: set[str]) -> bool:
    """Whether a result's check is one a label may name: one slonk ships, or one of at most
    MAX_COMMANDS site checks of the spec's shape (`sites`, those seen so far this scrape)."""
    if check in CHECKS:
        return True
    if not isinstance(check, str) or not SITE_CHECK.fullmatch(check):
        return False
    if check not in sites and len(sites) >= active_checks.MAX_COMMANDS:
        return False
    sites.add(check)
    return True


def health_families(state: Path, node: str) -> list[Family]:
    """slonk_health_check_ok, _duration_seconds, _last_run_timestamp_seconds{node,check,phase}.
    `node` is this pod's name; checks neither slonk ships nor a site may name
    (health.active.commands) and phases slonk does not run are left out, so no label comes
    from the files' text unbounded."""
    labels = ("node", "check", "phase")
    ok = Family("slonk_health_check_ok", GAUGE, "Whether the check passed on its last run "
                "(1) or failed (0).", labels)  # fmt: skip
    duration = Family("slonk_health_check_duration_seconds", GAUGE, "How long the check's "
                      "last run took.", labels)  # fmt: skip
    last = Family("slonk_health_check_last_run_timestamp_seconds", GAUGE, "When the check "
                  "last ran, in seconds since the epoch.", labels)  # fmt: skip
    problems: list[str] = []
    sites: set[str] = set()
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
            if not served(check, sites):
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
