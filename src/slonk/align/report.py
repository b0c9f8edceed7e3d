"""`slonk align`: every node as Slurm and Kubernetes each see it, and what the syncer would do."""

from __future__ import annotations

from slonk.align.plan import Plan
from slonk.base.text import printable

COLUMNS = ("NODE", "POD", "K8S NODE", "KUBERNETES SAYS", "SLURM", "JOBS", "DRIFT")


def _cell(text: str, width: int = 60) -> str:
    """Object text and reasons are anyone's: one printable line, cut to the column."""
    flat = printable(text)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def table(result: Plan) -> str:
    patched = {p.pod for p in result.patches}
    rows = [COLUMNS]
    for row in result.rows:
        says = "; ".join(f"{c.word}: {c.detail}" for c in row.causes) or "ok"
        if not row.certain:
            says += " (not all known)"
        slurm = row.slurm + (f" ({row.reason})" if row.reason else "")
        drift = [f"{a.verb}" + (f" {a.reason}" if a.reason else "") for a in row.actions]
        if row.node in patched:
            drift.append("show Slurm's view on the pod")
        rows.append((
            row.node, _cell(row.pod, 20), _cell(row.machine), _cell(says), _cell(slurm),
            str(row.jobs), _cell("; ".join(drift) or "-", 80),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=False)) + r[-1]
        for r in rows
    )
