"""A worker's GPUs as metrics, one series per GPU: utilization, memory, power, temperature,
the clock event (throttle) reasons, ECC errors and remapped rows, from one nvidia-smi query a
scrape; and NVLink's error counters, which nvidia-smi's queries lack, from one query of
slonk.health.nvml, which answers alike. The commands are the node's GPU check's own (its
health plan, `nvidiaSmi` and `nvml`): a node without that check exports no GPU series."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slonk.base.paths import HEALTH_PLAN
from slonk.health.gpu import query
from slonk.health.nvml import NVLINK_FIELDS
from slonk.health.probe import Unhealthy
from slonk.health.runner import load_plan
from slonk.metrics.family import COUNTER, GAUGE, Family, RecordError

MIB = 1024 * 1024
# Within the scrape's deadline (slonk.metrics.collector), whatever the check's own timeout.
QUERY_SECONDS = 5.0


@dataclass(frozen=True)
class Series:
    field: str  # nvidia-smi's --query-gpu name
    name: str
    kind: str
    help: str
    scale: float = 1.0


TELEMETRY = (
    Series("utilization.gpu", "slonk_gpu_utilization_ratio", GAUGE,
           "Share of the last sample period in which a kernel ran on the GPU.", 0.01),
    Series("memory.used", "slonk_gpu_memory_used_bytes", GAUGE,
           "GPU memory in use.", MIB),
    Series("memory.total", "slonk_gpu_memory_total_bytes", GAUGE,
           "GPU memory in all.", MIB),
    Series("power.draw", "slonk_gpu_power_watts", GAUGE,
           "The GPU's power draw."),
    Series("temperature.gpu", "slonk_gpu_temperature_celsius", GAUGE,
           "The GPU core's temperature."),
    Series("clocks_event_reasons.active", "slonk_gpu_clock_event_reasons", GAUGE,
           "Why the GPU's clocks are held down now, NVML's bit mask (0: they are not; "
           "0x1 idle, 0x4 power cap, 0x8 hardware slowdown, 0x20 software thermal, 0x40 "
           "hardware thermal, 0x80 power brake)."),
    Series("ecc.errors.corrected.aggregate.total", "slonk_gpu_ecc_corrected_errors_total",
           COUNTER, "Corrected ECC errors over the GPU's life: a rising rate comes before "
           "failures."),
    Series("ecc.errors.uncorrected.aggregate.total", "slonk_gpu_ecc_uncorrected_errors_total",
           COUNTER, "Uncorrected ECC errors over the GPU's life."),
    Series("remapped_rows.correctable", "slonk_gpu_remapped_rows_correctable", GAUGE,
           "Memory rows remapped after correctable errors."),
    Series("remapped_rows.uncorrectable", "slonk_gpu_remapped_rows_uncorrectable", GAUGE,
           "Memory rows remapped after uncorrectable errors."),
)  # fmt: skip
FIELDS = ("index", *(s.field for s in TELEMETRY))
# The clock event reasons' name before driver R535 (it was renamed then): a driver that knows
# one name only refuses the whole query with the other.
OLD_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
UNKNOWN_FIELD = "is not a valid field to query"


def value(cell: str) -> float | None:
    """A cell as a number: decimal, or hexadecimal (the reasons' mask); None where the GPU
    does not say (`[N/A]`, `[Not Supported]`: ECC off, no row remapping)."""
    try:
        return float(int(cell, 16)) if cell.startswith("0x") else float(cell)
    except ValueError:
        return None


def _gpu_options(plan: Path) -> dict[str, object] | None:
    """The node's GPU check's options; None without one."""
    try:
        check = load_plan(plan).checks.get("gpu")
    except FileNotFoundError:
        return None
    return None if check is None else dict(check["options"])


def gpu_families(node: str, plan: Path = HEALTH_PLAN) -> list[Family]:
    """Every GPU's series, labelled with this pod's `node` and the GPU's index."""
    options = _gpu_options(plan)
    if options is None:
        return []
    families = [Family(s.name, s.kind, s.help, ("node", "gpu")) for s in TELEMETRY]
    command = str(options["nvidiaSmi"])
    try:
        try:
            rows = query(command, FIELDS, "gpu", QUERY_SECONDS)
        except Unhealthy as err:
            if UNKNOWN_FIELD not in str(err):
                raise
            older = tuple(OLD_NAMES.get(f, f) for f in FIELDS)
            rows = query(command, older, "gpu", QUERY_SECONDS)
    except Unhealthy as err:  # counted as the source's error; the health check drains
        raise RecordError(f"nvidia-smi: {err}") from None
    for index, *cells in rows:
        if not index.isdigit():
            continue
        for series, family, cell in zip(TELEMETRY, families, cells, strict=True):
            found = value(cell)
            if found is not None and found >= 0:
                family.set(found * series.scale, node, index)
    return families


# Each NVLink counter by its `kind` label: sums over a GPU's links (slonk.health.nvml).
NVLINK_KINDS = {field.split(".")[2]: field for field in NVLINK_FIELDS}


def nvlink_families(node: str, plan: Path = HEALTH_PLAN) -> list[Family]:
    """slonk_gpu_nvlink_errors_total{node,gpu,kind}: a GPU without NVLink has none."""
    options = _gpu_options(plan)
    if options is None or not options.get("nvml"):
        return []
    errors = Family("slonk_gpu_nvlink_errors_total", COUNTER, "NVLink errors over all of the "
                    "GPU's links since the driver loaded, by kind: crc (CRC errors, each "
                    "replayed), crc_data (before Hopper), replay, recovery (a link "
                    "retrained). A rising rate comes before a link fails.",
                    ("node", "gpu", "kind"))  # fmt: skip
    fields = ("index", *NVLINK_KINDS.values())
    try:
        rows = query(str(options["nvml"]), fields, "gpu", QUERY_SECONDS)
    except Unhealthy as err:
        raise RecordError(f"NVLink counters: {err}") from None
    for index, *cells in rows:
        for kind, cell in zip(NVLINK_KINDS, cells, strict=True):
            found = value(cell)
            if index.isdigit() and found is not None and found >= 0:
                errors.set(found, node, index, kind)
    return [errors]
