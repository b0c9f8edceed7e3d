"""The syncer's counts since its process started, written after every pass (paths.SYNCER_STATS)
for the exporter: passes, errors (a pass that failed, a change Slurm or the API refused) and
the Slurm changes it made, by action."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from slonk.base import paths
from slonk.base.files import write_atomically

ACTIONS = ("drain", "resume", "down", "lend", "give-back")


@dataclass
class Stats:
    passes: int = 0
    errors: int = 0
    actions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ACTIONS, 0))
    last_pass_seconds: float = 0.0

    def document(self) -> dict[str, object]:
        return {
            "passes": self.passes,
            "errors": self.errors,
            "actions": dict(self.actions),
            "lastPassSeconds": self.last_pass_seconds,
        }

    def save(self, path: Path = paths.SYNCER_STATS) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(self.document()) + "\n")
