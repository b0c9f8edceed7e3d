"""slonk.health.nvml, the reader of the GPU counters nvidia-smi's queries lack (NVLink's
errors), over local mode's FakeNvml in the driver library's place: the query it answers as
nvidia-smi does, what a GPU without a counter reads, and the refusals. The calls into the real
library run in the node acceptance test on a GPU machine."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from slonk.health import nvml
from slonk.local.fake_gpu import FakeNvml, gpus

QUERY = "--query-gpu=index,pci.bus_id,nvlink.errors.crc_flit.total,nvlink.errors.recovery.total"


def run(args: list[str], library: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = nvml.main(args, library=lambda: library)
    out, err = capsys.readouterr()
    return status, out, err


def test_it_answers_a_query_as_nvidia_smi_does(capsys):
    rows = gpus("healthy")
    rows[1]["nvlink.errors.crc_flit.total"] = "1234"
    status, out, _ = run([QUERY, nvml.FORMAT], FakeNvml(rows), capsys)
    assert status == 0
    assert out == "0, 00000000:18:00.0, 0, 0\n1, 00000000:2A:00.0, 1234, 0\n"


def test_a_counter_the_gpu_does_not_keep_reads_not_available(capsys):
    rows = gpus("healthy")
    for row in rows:
        row["nvlink.errors.crc_flit.total"] = "[N/A]"  # FakeNvml: NVML_ERROR_NOT_SUPPORTED
    status, out, _ = run([QUERY, nvml.FORMAT], FakeNvml(rows), capsys)
    assert status == 0
    assert out.splitlines()[0] == "0, 00000000:18:00.0, [N/A], 0"


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


def test_no_library_is_said_plainly(capsys):
    def missing() -> ctypes.CDLL:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert nvml.main([QUERY, nvml.FORMAT], library=missing) == 9
    assert "NVML: libnvidia-ml.so.1: cannot open" in capsys.readouterr().err


def test_the_structures_have_nvmls_layout():
    # nvml.h: nvmlFieldValue_t is 40 bytes, its value at 32; nvmlPciInfo_t is 68, busId at 36.
    assert ctypes.sizeof(nvml._FieldValue) == 40
    assert nvml._FieldValue.value.offset == 32
    assert ctypes.sizeof(nvml._PciInfo) == 68
    assert nvml._PciInfo.busId.offset == 36
