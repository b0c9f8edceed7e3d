"""slurmctld's scheduler health from one `sdiag --json`: cycle times, backfill, RPCs by type.
Slurm gives times in microseconds; the metrics are in seconds. Its counters start again at
midnight UTC and on `sdiag --reset`, which Prometheus' rate() reads as a counter reset."""

from __future__ import annotations

import json
import re

from slonk.metrics.family import COUNTER, GAUGE, Family, number
from slonk.slurm.slurm_state import SlurmError

COMMAND = ("sdiag", "--json")
MICROSECONDS = 1e-6
# An RPC's label is Slurm's message type (REQUEST_NODE_INFO, ...), never other text.
RPC_TYPE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# name, help, kind, Slurm's statistic, scale.
SCALARS = (
    ("slonk_scheduler_cycle_last_seconds", "Duration of the last main scheduling cycle.",
     GAUGE, "schedule_cycle_last", MICROSECONDS),
    ("slonk_scheduler_cycle_mean_seconds", "Mean duration of main scheduling cycles since "
     "Slurm's statistics were reset.", GAUGE, "schedule_cycle_mean", MICROSECONDS),
    ("slonk_scheduler_cycles_total", "Main scheduling cycles since Slurm's statistics were "
     "reset.", COUNTER, "schedule_cycle_total", 1),
    ("slonk_scheduler_queue_length", "Jobs the last main scheduling cycle looked at.",
     GAUGE, "schedule_queue_length", 1),
    ("slonk_backfill_cycle_last_seconds", "Duration of the last backfill cycle.",
     GAUGE, "bf_cycle_last", MICROSECONDS),
    ("slonk_backfill_cycles_total", "Backfill cycles since Slurm's statistics were reset.",
     COUNTER, "bf_cycle_counter", 1),
    ("slonk_backfilled_jobs_total", "Jobs started by backfill since slurmctld started.",
     COUNTER, "bf_backfilled_jobs", 1),
    ("slonk_server_threads", "slurmctld's active server threads.",
     GAUGE, "server_thread_count", 1),
    ("slonk_agent_queue_size", "Outgoing RPCs slurmctld has queued to retry.",
     GAUGE, "agent_queue_size", 1),
)  # fmt: skip


def sdiag_families(text: str) -> list[Family]:
    """The families above, and slonk_rpcs_total{rpc}, slonk_rpc_seconds_total{rpc}. A
    statistic Slurm leaves out reads 0; output that is not sdiag's JSON is a SlurmError."""
    where = " ".join(COMMAND)
    try:
        data = json.loads(text)
    except ValueError as err:
        raise SlurmError(f"{where}: output is not JSON ({err})") from None
    stats = data.get("statistics") if isinstance(data, dict) else None
    if not isinstance(stats, dict):
        raise SlurmError(f"{where}: `statistics` is missing or not an object")
    families = []
    for name, help_text, kind, key, scale in SCALARS:
        family = Family(name, kind, help_text)
        family.set(number(stats.get(key)) * scale)
        families.append(family)
    rpcs = Family("slonk_rpcs_total", COUNTER, "RPCs slurmctld received, by message type.",
                  ("rpc",))  # fmt: skip
    seconds = Family("slonk_rpc_seconds_total", COUNTER, "Time slurmctld spent on RPCs, by "
                     "message type.", ("rpc",))  # fmt: skip
    by_type = stats.get("rpcs_by_message_type")
    for item in by_type if isinstance(by_type, list) else []:
        rpc = item.get("message_type") if isinstance(item, dict) else None
        if isinstance(rpc, str) and RPC_TYPE.fullmatch(rpc):
            rpcs.add(number(item.get("count")), rpc)
            seconds.add(number(item.get("total_time")) * MICROSECONDS, rpc)
    return [*families, rpcs, seconds]
