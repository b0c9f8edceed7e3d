"""The GPU counters nvidia-smi's queries lack, NVLink's error counts, read from the driver's
management library (libnvidia-ml.so.1, which the NVIDIA container toolkit mounts into the pod
beside nvidia-smi) through ctypes, and answered the way nvidia-smi answers a query, so that
the GPU check's reader (slonk.health.gpu.query) serves both:

    python3 -I -m slonk.health.nvml --query-gpu=index,pci.bus_id,nvlink.errors.crc.total \\
        --format=csv,noheader,nounits

Each counter is the sum over the GPU's links since the driver loaded: a link whose CRC or
replay count climbs is wearing out before it fails. NVML counts them two ways: its notes for
R525 say Hopper counts per link (the `DL_` fields, asked link by link) where earlier GPUs kept
whole-GPU totals. This reader sums the links that answer, and takes the total where no link
does. A counter neither gives reads `[N/A]`, as nvidia-smi prints it: no NVLink, or a GPU
whose drivers count otherwise (Blackwell's; not read yet).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence

LIBRARY = "libnvidia-ml.so.1"
FORMAT = "--format=csv,noheader,nounits"
NOT_AVAILABLE = "[N/A]"

# NVML's field ids (nvml.h, nvmlFieldValueEnums), by counter: its count per link (Hopper on,
# scope: the link), then its total over all links (before Hopper). CRC data errors have no
# count per link.
NVLINK_FIELDS: dict[str, tuple[int | None, int]] = {
    # NVML_FI_DEV_NVLINK_ERROR_DL_CRC, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    "nvlink.errors.crc.total": (163, 38),
    # -, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
    "nvlink.errors.crc_data.total": (None, 45),
    # NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    "nvlink.errors.replay.total": (161, 52),
    # NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
    "nvlink.errors.recovery.total": (162, 59),
}
LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT: the links the GPU has
MAX_LINKS = 64  # more than any GPU has (NVML_NVLINK_MAX_LINKS is 18)
FIELDS = ("index", "pci.bus_id", "nvlink.links", *NVLINK_FIELDS)

SUCCESS = 0
# nvmlValueType_t: how to read a field's value union.
VALUE_TYPES = {
    0: "dVal",  # double
    1: "uiVal",  # unsigned int
    2: "ulVal",  # unsigned long
    3: "ullVal",  # unsigned long long
    4: "sllVal",  # signed long long
    5: "siVal",  # signed int
    6: "usVal",  # unsigned short
}


class _Value(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class _FieldValue(ctypes.Structure):  # nvmlFieldValue_t
    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", _Value),
    ]


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class NvmlError(Exception):
    pass


class Nvml:
    """The few calls this needs, each checked: an error names the call and NVML's words."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.nvmlErrorString.restype = ctypes.c_char_p
        lib.nvmlErrorString.argtypes = [ctypes.c_int]

    def call(self, name: str, *args: object) -> None:
        status = getattr(self.lib, name)(*args)
        if status != SUCCESS:
            words = self.lib.nvmlErrorString(status) or b"unknown error"
            raise NvmlError(f"{name}: {words.decode(errors='replace')} ({status})")

    def rows(self, fields: Sequence[str]) -> list[list[str]]:
        self.call("nvmlInit_v2")
        try:
            count = ctypes.c_uint()
            self.call("nvmlDeviceGetCount_v2", ctypes.byref(count))
            return [self._row(index, fields) for index in range(count.value)]
        finally:
            self.lib.nvmlShutdown()

    def _fields(self, handle: ctypes.c_void_p, asked: Sequence[tuple[int, int]]) -> list[str]:
        """Each (field id, scope) asked, read as nvidia-smi prints a number, or [N/A]."""
        values = (_FieldValue * max(1, len(asked)))()
        for slot, (field_id, scope) in zip(values, asked, strict=False):
            slot.fieldId, slot.scopeId = field_id, scope
        if asked:
            self.call("nvmlDeviceGetFieldValues", handle, ctypes.c_int(len(asked)), values)
        return [_read(v) for v in values[: len(asked)]]

    def _row(self, index: int, fields: Sequence[str]) -> list[str]:
        handle = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        (links,) = self._fields(handle, [(LINK_COUNT, 0)])
        count = min(int(links), MAX_LINKS) if links.isdigit() else 0
        counters = [f for f in fields if f in NVLINK_FIELDS]
        totals = self._fields(handle, [(NVLINK_FIELDS[f][1], 0) for f in counters])
        per_link = [f for f in counters if NVLINK_FIELDS[f][0] is not None] if count else []
        answers = self._fields(
            handle, [(NVLINK_FIELDS[f][0] or 0, link) for f in per_link for link in range(count)]
        )
        by_link = {f: answers[i * count : (i + 1) * count] for i, f in enumerate(per_link)}
        counts = {
            f: _counted(by_link.get(f, []), total)
            for f, total in zip(counters, totals, strict=True)
        }
        cells = []
        for field in fields:
            if field == "index":
                cells.append(str(index))
            elif field == "pci.bus_id":
                pci = _PciInfo()
                self.call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(pci))
                cells.append(pci.busId.decode(errors="replace"))
            elif field == "nvlink.links":
                cells.append(links)
            else:
                cells.append(counts[field])
        return cells


def _counted(links: list[str], total: str) -> str:
    """A counter's sum over the links that answer it (a link down answers nothing, and must
    not hide the others' errors), or the GPU's total where no link counts it."""
    answered = [int(v) for v in links if v.isdigit()]
    return str(sum(answered)) if answered else total


def _read(value: _FieldValue) -> str:
    """A field's value as nvidia-smi prints a number, or [N/A] where the GPU has none."""
    member = VALUE_TYPES.get(value.valueType)
    if value.nvmlReturn != SUCCESS or member is None:
        return NOT_AVAILABLE
    number = getattr(value.value, member)
    return str(int(number)) if number >= 0 else NOT_AVAILABLE


def load() -> ctypes.CDLL:
    return ctypes.CDLL(LIBRARY)


def main(argv: Sequence[str] | None = None, library: Callable[[], ctypes.CDLL] = load) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    query = next((a for a in args if a.startswith("--query-gpu=")), "")
    if not query or sorted(args) != sorted([query, FORMAT]):
        print(f"usage: python3 -m slonk.health.nvml --query-gpu=FIELDS {FORMAT}", file=sys.stderr)
        print(f"fields: {','.join(FIELDS)}", file=sys.stderr)
        return 2
    fields = query.removeprefix("--query-gpu=").split(",")
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:  # nvidia-smi's words, which slonk.health.gpu.query passes on
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    try:
        rows = Nvml(library()).rows(fields)
    except (OSError, AttributeError, NvmlError) as err:  # AttributeError: a call it lacks
        print(f"NVML: {err}", file=sys.stderr)
        return 9
    for row in rows:
        print(", ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
