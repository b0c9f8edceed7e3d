"""slonk.health.nvml, the reader of the GPU counters nvidia-smi's queries lack (NVLink's
errors), over local mode's FakeNvml in the driver library's place: the query it answers as
nvidia-smi does, NVML's two ways of counting (per link from Hopper on, a total before), what a
GPU without a counter reads, and the refusals. The calls into the real library run in the node
acceptance test on a GPU machine."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from slonk.health import nvml
from slonk.local.fake_gpu import FakeNvml, gpus

COUNTERS = "nvlink.errors.crc.total,nvlink.errors.crc_data.total,nvlink.errors.recovery.total"
QUERY = f"--query-gpu=index,pci.bus_id,nvlink.links,{COUNTERS}"


def run(args: list[str], library: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = nvml.main(args, library=lambda: library)
    out, err = capsys.readouterr()
    return status, out, err


def rows_with(**counts: str) -> list[dict[str, str]]:
    """The fake's two healthy GPUs, GPU 1's counters as given (`crc` for nvlink.errors.crc)."""
    rows = gpus("healthy")
    for kind, count in counts.items():
        rows[1][f"nvlink.errors.{kind}.total"] = count
    return rows


def test_a_hoppers_counts_per_link_are_summed(capsys):
    status, out, _ = run([QUERY, nvml.FORMAT], FakeNvml(rows_with(crc="1234")), capsys)
    assert status == 0
    assert out == (
        "0, 00000000:18:00.0, 18, 0, [N/A], 0\n"  # a Hopper keeps no CRC data count
        "1, 00000000:2A:00.0, 18, 1234, [N/A], 0\n"
    )


class LinkDown(FakeNvml):
    """A Hopper whose link 0 answers nothing (down), whose other links count, and whose
    whole-GPU totals answer 0 (as one report says a Hopper's do)."""

    def _value(self, row: dict[str, str], field_id: int, scope: int) -> int | None:
        per_link = {ids[0] for ids in nvml.NVLINK_FIELDS.values()}
        if field_id in per_link:
            return None if scope == 0 else 5
        if field_id in {ids[1] for ids in nvml.NVLINK_FIELDS.values()}:
            return 0
        return super()._value(row, field_id, scope)


def test_a_link_that_answers_nothing_hides_no_other_links_errors(capsys):
    status, out, _ = run([QUERY, nvml.FORMAT], LinkDown(gpus("healthy")), capsys)
    assert status == 0
    # 17 links of 5 each; CRC data errors, which no link counts, from the total.
    assert out.splitlines()[1] == "1, 00000000:2A:00.0, 18, 85, 0, 85"


def test_an_earlier_gpus_totals_are_read_where_it_counts_no_link(capsys):
    library = FakeNvml(rows_with(crc="7", crc_data="3"), hopper=False)
    status, out, _ = run([QUERY, nvml.FORMAT], library, capsys)
    assert status == 0
    assert out.splitlines()[1] == "1, 00000000:2A:00.0, 18, 7, 3, 0"


def test_a_counter_the_gpu_does_not_keep_reads_not_available(capsys):
    status, out, _ = run([QUERY, nvml.FORMAT], FakeNvml(rows_with(crc="[N/A]")), capsys)
    assert status == 0
    assert out.splitlines()[1] == "1, 00000000:2A:00.0, 18, [N/A], [N/A], 0"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--query-gpu=index,memory.used", nvml.FORMAT], 'Field "memory.used" is not a valid'),
        ([QUERY], "usage:"),
        ([QUERY, nvml.FORMAT, "-i", "0"], "usage:"),
        ([], "usage:"),
    ],
)
def test_it_refuses_what_it_does_not_answer(args, said, capsys):
    status, out, err = run(args, FakeNvml(gpus("healthy")), capsys)
    assert status == 2
    assert out == ""
    assert err.startswith(said)


def test_a_failing_call_is_named_with_nvmls_words(capsys):
    library = FakeNvml(gpus("healthy"))
    library.nvmlInit_v2 = lambda: 9  # type: ignore[method-assign]  # NVML_ERROR_DRIVER_NOT_LOADED
    library.nvmlErrorString = lambda status: b"Driver Not Loaded"
    status, _, err = run([QUERY, nvml.FORMAT], library, capsys)
    assert status == 9
    assert err.strip() == "NVML: nvmlInit_v2: Driver Not Loaded (9)"


class OlderLibrary(FakeNvml):
    """A driver's library from before a call the reader makes: ctypes finds no such symbol."""

    def __getattribute__(self, name: str) -> Any:
        if name == "nvmlDeviceGetPciInfo_v3":
            raise AttributeError(f"libnvidia-ml.so.1: undefined symbol: {name}")
        return super().__getattribute__(name)


def test_no_library_or_an_older_one_is_said_plainly(capsys):
    def missing() -> ctypes.CDLL:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert nvml.main([QUERY, nvml.FORMAT], library=missing) == 9
    assert "NVML: libnvidia-ml.so.1: cannot open" in capsys.readouterr().err
    assert nvml.main([QUERY, nvml.FORMAT], library=lambda: OlderLibrary(gpus("healthy"))) == 9
    said = capsys.readouterr().err.strip()
    assert said == "NVML: libnvidia-ml.so.1: undefined symbol: nvmlDeviceGetPciInfo_v3"


def test_the_structures_have_nvmls_layout():
    # nvml.h: nvmlFieldValue_t is 40 bytes, its value at 32; nvmlPciInfo_t is 68, busId at 36.
    assert ctypes.sizeof(nvml._FieldValue) == 40
    assert nvml._FieldValue.value.offset == 32
    assert ctypes.sizeof(nvml._PciInfo) == 68
    assert nvml._PciInfo.busId.offset == 36
