"""A FAKE of `nvidia-smi` and of the kernel log's GPU lines, for local mode, where there are no
GPUs: what slonk's GPU check and a user's `nvidia-smi -L` read of a node of H100s. It answers
`--query-gpu=FIELDS` and `--query-compute-apps=FIELDS` (with `--format=csv,noheader,nounits`)
and `-L`, and refuses anything else. Local mode's fake device plugin (slonk.local.podinit)
gives a GPU pool's pod one /dev/nvidiaN per GPU it asks for, each a null device, and this as
its nvidia-smi, with their number in FAKE_GPU_COUNT (two without: the tests' CPU pools
standing for GPU ones). Like the real one it shows every GPU of the pod, whatever
CUDA_VISIBLE_DEVICES says; only a device cgroup hides GPUs, and local mode confines nothing.

It also stands for slonk.health.cuda, the active checks' probe (`probe memory|compute`):
each GPU's copy bandwidth and FMA throughput, a healthy H100's as measured on one; and for the
driver's library under slonk.health.nvml, the reader of NVLink's error counters (`nvml ARGS`:
slonk's reader itself, over FakeNvml).

Each node's GPUs are in the state named by /home/.fake-gpu/<hostname> (one word; no file
means healthy), kept in the shared /home so that it outlasts pod restarts, as hardware does:
  healthy  ecc  remap  missing  lost  xid  leftover
  slow-memory  slow-compute  (GPU 1 measures slow)  hang  (the probe never answers)
  long-check  (the probe takes ten minutes, then measures healthy: a long diagnostic)
  rising  (GPU 1's corrected ECC errors climb by RISING_PER_SECOND from the file's writing)
  nvlink-rising  (GPU 1's NVLink CRC errors climb alike)
Each GPU has a serial number (`--query-gpu=serial`: 13 digits, as NVIDIA's data-centre boards
print), the same for the same hostname: the machine's, kept across pod restarts.
Usage: python3 -m slonk.local.fake_gpu nvidia-smi ARGS... | dmesg ARGS... | probe MEASURE |
       nvml ARGS...
"""

import contextlib
import ctypes
import json
import os
import re
import sys
import time
import zlib
from typing import Any

from slonk.health import nvml

SCENARIO_FILE = os.environ.get("FAKE_GPU_SCENARIO", f"/home/.fake-gpu/{os.uname().nodename}")
HEALTHY = {
    "name": "NVIDIA H100 80GB HBM3",
    "ecc.errors.uncorrected.volatile.total": "0",
    "retired_pages.pending": "[N/A]",  # Hopper remaps rows instead of retiring pages
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
    "memory.used": "0",
    # What the exporter reads (slonk.metrics.gpus): an idle H100 SXM.
    "utilization.gpu": "0",
    "memory.total": "81559",
    "power.draw": "69.47",
    "temperature.gpu": "31",
    "clocks_event_reasons.active": "0x0000000000000001",  # idle: clocks held down
    "ecc.errors.corrected.aggregate.total": "0",
    "ecc.errors.uncorrected.aggregate.total": "0",
    "remapped_rows.correctable": "0",
    "remapped_rows.uncorrectable": "0",
}
# The counters NVLink keeps, which the real nvidia-smi's queries lack: slonk.health.nvml reads
# them from the driver's library, which FakeNvml stands for.
NVLINK = {**dict.fromkeys(nvml.NVLINK_FIELDS, "0"), "nvlink.errors.crc_data.total": "[N/A]"}
RISING_PER_SECOND = 20
RISING = {
    "rising": "ecc.errors.corrected.aggregate.total",
    "nvlink-rising": "nvlink.errors.crc.total",
}
BUSES = ["00000000:18:00.0", "00000000:2A:00.0"]  # then one every 0x12, as on an HGX board
DEFAULT_COUNT = 2
FORMAT = "--format=csv,noheader,nounits"
KERNEL_LOG = [
    "nvidia-nvlink: Nvlink Core is being initialized, major device number 237",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01",
]
XID = "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
LOST = "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error"


def scenario() -> str:
    try:
        with open(SCENARIO_FILE) as f:
            return f.read().strip() or "healthy"
    except FileNotFoundError:
        return "healthy"


def serial(index: int) -> str:
    machine = zlib.crc32(os.uname().nodename.encode()) % 10**8
    return f"1654{machine:08d}{index}"


def count() -> int:
    """The pod's GPUs: as many as the fake device plugin gave it (its nvidia-smi says so in
    FAKE_GPU_COUNT; the probe and the NVML reader count its /dev/nvidiaN, null devices, so a
    real GPU's device on a test machine is not counted), else DEFAULT_COUNT."""
    given = os.environ.get("FAKE_GPU_COUNT", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    null = os.stat("/dev/null").st_rdev
    found = 0
    for name in os.listdir("/dev"):
        if re.fullmatch(r"nvidia[0-9]+", name):
            with contextlib.suppress(OSError):
                found += os.stat(f"/dev/{name}").st_rdev == null
    return found or DEFAULT_COUNT


def bus(index: int) -> str:
    return BUSES[index] if index < len(BUSES) else f"00000000:{0x18 + 0x12 * index:02X}:00.0"


def gpus(state: str) -> list[dict[str, str]]:
    rows = []
    for index in range(count()):
        bus_id = bus(index)
        row = dict(HEALTHY, index=str(index), **{"pci.bus_id": bus_id, "uuid": f"GPU-fa4e{index}"})
        row.update(NVLINK)
        row["serial"] = serial(index)
        rows.append(row)
    if state == "ecc":
        rows[1]["ecc.errors.uncorrected.volatile.total"] = "2"
        rows[1]["ecc.errors.uncorrected.aggregate.total"] = "2"
        rows[1]["remapped_rows.pending"] = "Yes"
    if state == "remap":
        rows[0]["remapped_rows.failure"] = "Yes"
    if state == "leftover":
        rows[0]["memory.used"] = "40960"
    if state in ("missing", "lost"):
        rows.pop()
    if state in RISING:
        climbed = int(max(0.0, time.time() - os.stat(SCENARIO_FILE).st_mtime) * RISING_PER_SECOND)
        rows[1][RISING[state]] = str(climbed)
    return rows


def nvidia_smi(args: list[str]) -> int:
    state = scenario()
    if args == ["-L"]:
        for row in gpus(state):
            print(f"GPU {row['index']}: {row['name']} (UUID: {row['uuid']})")
        return 0
    query = next((a for a in args if a.startswith("--query-")), "")
    kind, _, fields = query.partition("=")
    if kind not in ("--query-gpu", "--query-compute-apps") or sorted(args) != sorted(
        [query, FORMAT]
    ):
        print(
            f"fake nvidia-smi (slonk local): {' '.join(args) or 'no arguments'} is not "
            "implemented; only -L, --query-gpu=FIELDS or --query-compute-apps=FIELDS with "
            + FORMAT,
            file=sys.stderr,
        )
        return 2
    if kind == "--query-compute-apps":
        if state == "leftover":
            print("48213, python, 40958")
        return 0
    rows = gpus(state)
    unknown = [f for f in fields.split(",") if f not in rows[0] or f in NVLINK] if rows else []
    if unknown:  # the real one's words
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    for row in rows:
        print(", ".join(row[f] for f in fields.split(",")))
    if state == "lost":
        print(LOST)
        return 15
    return 0


# What slonk.health.cuda measured on a healthy H100 80GB HBM3 (issue 32), and what the slow
# scenarios give GPU 1.
PROBES = {"memory": ("GB/s", 3025.0, 1210.0), "compute": ("TFLOP/s", 57.8, 21.5)}
LONG_CHECK_SECONDS = 600


def probe(args: list[str]) -> int:
    if len(args) != 1 or args[0] not in PROBES:
        print(f"fake GPU probe (slonk local): expected one of {', '.join(PROBES)}", file=sys.stderr)
        return 2
    state, measure = scenario(), args[0]
    if state == "hang":
        while True:
            time.sleep(3600)
    if state == "long-check":
        time.sleep(LONG_CHECK_SECONDS)
    unit, healthy, slow = PROBES[measure]
    for row in gpus(state):
        index = int(row["index"])
        value = slow if index == 1 and state == f"slow-{measure}" else healthy + index
        line = {"index": index, "name": row["name"], "value": value, "unit": unit}
        print(json.dumps(line))
    return 0


class FakeNvml:
    """A FAKE of the few calls of the driver's library (libnvidia-ml.so.1) slonk.health.nvml
    makes, over this fake's GPUs: it stands for the library, not for slonk's reader, which runs
    as it would on a real node (only ctypes' calls into C are not exercised). As a Hopper's
    driver does, it counts NVLink's errors per link (all of a GPU's on its first link) and keeps
    no total; `hopper=False` counts as earlier GPUs do, totals alone. Arguments come as ctypes
    passes them: byref() wraps the object the call fills."""

    NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
    UNSIGNED_INT, UNSIGNED_LONG_LONG = 1, 3  # nvmlValueType_t
    LINKS = 18  # an H100 SXM's

    def __init__(self, rows: list[dict[str, str]], hopper: bool = True) -> None:
        self.rows, self.hopper = rows, hopper
        self.nvmlErrorString: Any = lambda status: b"Not Supported"

    def nvmlInit_v2(self) -> int:
        return 0

    def nvmlShutdown(self) -> int:
        return 0

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = len(self.rows)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: ctypes.c_uint, handle: Any) -> int:
        handle._obj.value = index.value + 1  # a null handle is none
        return 0

    def _row(self, handle: ctypes.c_void_p) -> dict[str, str]:
        return self.rows[(handle.value or 0) - 1]

    def nvmlDeviceGetPciInfo_v3(self, handle: ctypes.c_void_p, pci: Any) -> int:
        pci._obj.busId = self._row(handle)["pci.bus_id"].encode()
        return 0

    def _value(self, row: dict[str, str], field_id: int, scope: int) -> int | None:
        if field_id == nvml.LINK_COUNT:
            return self.LINKS
        for name, (per_link, total) in nvml.NVLINK_FIELDS.items():
            count = int(row[name]) if row[name].isdigit() else None
            if self.hopper and field_id == per_link and scope < self.LINKS and count is not None:
                return count if scope == 0 else 0
            if not self.hopper and field_id == total:
                return count
        return None

    def nvmlDeviceGetFieldValues(
        self, handle: ctypes.c_void_p, n: ctypes.c_int, values: Any
    ) -> int:
        row = self._row(handle)
        for value in values[: n.value]:
            found = self._value(row, value.fieldId, value.scopeId)
            if found is None:
                value.nvmlReturn = self.NOT_SUPPORTED
            else:
                value.valueType, value.nvmlReturn = self.UNSIGNED_LONG_LONG, 0
                value.value.ullVal = found
        return 0


def nvml_reader(args: list[str]) -> int:
    """slonk.health.nvml itself, over FakeNvml."""
    state = scenario()
    return nvml.main(args, library=lambda: FakeNvml(gpus(state)))  # type: ignore[arg-type,return-value]


def dmesg() -> int:
    lines = KERNEL_LOG + ([XID] if scenario() == "xid" else [])
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    tool, *rest = argv
    if tool == "probe":
        return probe(rest)
    if tool == "nvml":
        return nvml_reader(rest)
    return nvidia_smi(rest) if tool == "nvidia-smi" else dmesg()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
