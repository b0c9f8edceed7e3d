"""Every trend rule slonk has, with its defaults: a GPU counter that rises too fast over a window
drains the node `slonk:trend:<counter>` before the failure it foretells (issue 32: corrected
errors and row remaps climb for days before an uncorrectable error). `health.trends.rules.<name>`
overrides them. No imports beyond the model: every pod loads it with its spec.

Each rule reads one `nvidia-smi --query-gpu` field per GPU in the agent's watch phase (the
NVLink counters, which nvidia-smi's queries lack, from slonk.health.nvml, which answers alike)
and keeps the samples of its window on the node (slonk.health.trend). A trend drain is not
lifted when the counter stops rising (an idle, drained GPU makes no errors) nor recycled (a
new pod does not mend a board): it waits for a person, as a quarantine does."""

from __future__ import annotations

from collections.abc import Mapping

from slonk.config import check_names
from slonk.config.model import Rule, TrendRule

HOUR = 3600
DAY = 24 * HOUR
TRENDS: Mapping[str, TrendRule] = {
    # Corrected ECC errors since the driver loaded, all memory: a few a day are noise; a board
    # whose count climbs by thousands is wearing out.
    "ecc-corrected": TrendRule("ecc.errors.corrected.aggregate.total", 1000, DAY),
    # Rows remapped for correctable errors: each spends one of a bank's few spares.
    "remapped-rows": TrendRule("remapped_rows.correctable", 2, DAY),
    # NVLink flow-control CRC errors, all links: a replay hides each from the job, and a link
    # that keeps needing them is on its way to failing. A starting point, not a measurement:
    # healthy links count next to none; tune it where links are known (GPUs without NVLink
    # count nothing and pass).
    "nvlink-crc": TrendRule("nvlink.errors.crc.total", 100, HOUR),
}
NAMES = frozenset(f"{check_names.TREND_PREFIX}{name}" for name in TRENDS)
MAX_INCREASE = Rule("maxIncrease", int, minimum=0)
WINDOW = Rule("windowSeconds", int, minimum=60, maximum=30 * DAY)
