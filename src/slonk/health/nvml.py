"""The GPU counters nvidia-smi's queries lack, NVLink's error counts, read from the driver's
management library (libnvidia-ml.so.1, which the NVIDIA container toolkit mounts into the pod
beside nvidia-smi) through ctypes, and answered the way nvidia-smi answers a query, so that
the GPU check's reader (slonk.health.gpu.query) serves both:

    python3 -I -m slonk.health.nvml --query-gpu=index,pci.bus_id,nvlink.errors.crc_flit.total \\
        --format=csv,noheader,nounits

A counter a GPU does not keep (no NVLink; a field the driver does not know) reads `[N/A]`, as
nvidia-smi prints it. Each is the sum over the GPU's links since the driver loaded (NVML's
`_TOTAL` fields): a link whose CRC or replay count climbs is wearing out before it fails.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence

LIBRARY = "libnvidia-ml.so.1"
FORMAT = "--format=csv,noheader,nounits"
NOT_AVAILABLE = "[N/A]"

# NVML's field ids (nvml.h, nvmlFieldValueEnums): each counter's total over all links.
NVLINK_FIELDS = {
    "nvlink.errors.crc_flit.total": 38,  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    "nvlink.errors.crc_data.total": 45,  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
    "nvlink.errors.replay.total": 52,  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    "nvlink.errors.recovery.total": 59,  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
}
FIELDS = ("index", "pci.bus_id", *NVLINK_FIELDS)

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

    def _row(self, index: int, fields: Sequence[str]) -> list[str]:
        handle = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        wanted = [NVLINK_FIELDS[f] for f in fields if f in NVLINK_FIELDS]
        values = (_FieldValue * max(1, len(wanted)))()
        for slot, field_id in zip(values, wanted, strict=False):
            slot.fieldId = field_id
        if wanted:
            self.call("nvmlDeviceGetFieldValues", handle, ctypes.c_int(len(wanted)), values)
        counts = {v.fieldId: _read(v) for v in values[: len(wanted)]}
        cells = []
        for field in fields:
            if field == "index":
                cells.append(str(index))
            elif field == "pci.bus_id":
                pci = _PciInfo()
                self.call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(pci))
                cells.append(f"{pci.domain:08X}:{pci.bus:02X}:{pci.device:02X}.0")
            else:
                cells.append(counts[NVLINK_FIELDS[field]])
        return cells


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
    except (OSError, NvmlError) as err:
        print(f"NVML: {err}", file=sys.stderr)
        return 9
    for row in rows:
        print(", ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
