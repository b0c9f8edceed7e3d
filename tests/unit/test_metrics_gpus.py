"""A worker's GPU series (slonk.metrics.gpus), read through local mode's fake nvidia-smi (which
answers the same query the real one does) and through scripted answers for what the fake
does not show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slonk.metrics.family import RecordError
from slonk.metrics.gpus import FIELDS, MIB, gpu_families, nvlink_families

FAKE_GPU = Path(__file__).parents[1] / "fakes" / "fake-gpu"


def _plan(tmp_path: Path, nvidia_smi: str | None, nvml: str = f"{FAKE_GPU} nvml") -> Path:
    checks = {}
    if nvidia_smi:
        checks["gpu"] = {
            "phases": ["boot"],
            "timeoutSeconds": 10,
            "options": {"nvidiaSmi": nvidia_smi, "nvml": nvml},
        }
    plan = {
        "node": {"name": "slonk-gpu-0", "gpus": 2, "peers": ["slonk-gpu-0"]},
        "undrain": True,
        "checks": checks,
        "watch_seconds": 5,
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "scenario"
    monkeypatch.setenv("FAKE_GPU_SCENARIO", str(path))
    return path


def _series(families) -> dict[str, dict[tuple[str, ...], float]]:
    return {f.name: f.samples for f in families}


def test_every_gpu_gets_every_series_in_base_units(tmp_path, scenario):
    found = _series(gpu_families("slonk-gpu-0", _plan(tmp_path, f"{FAKE_GPU} nvidia-smi")))
    assert len(found) == len(FIELDS) - 1
    for gpu in ("0", "1"):
        key = ("slonk-gpu-0", gpu)
        assert found["slonk_gpu_memory_total_bytes"][key] == 81559 * MIB
        assert found["slonk_gpu_temperature_celsius"][key] == 31
        assert found["slonk_gpu_power_watts"][key] == 69.47
        assert found["slonk_gpu_clock_event_reasons"][key] == 1  # 0x...01: idle
        assert found["slonk_gpu_ecc_uncorrected_errors_total"][key] == 0


def test_a_gpus_errors_show_on_that_gpu(tmp_path, scenario):
    scenario.write_text("ecc\n")
    found = _series(gpu_families("slonk-gpu-0", _plan(tmp_path, f"{FAKE_GPU} nvidia-smi")))
    errors = found["slonk_gpu_ecc_uncorrected_errors_total"]
    assert errors == {("slonk-gpu-0", "0"): 0, ("slonk-gpu-0", "1"): 2}


def test_what_a_gpu_does_not_report_is_left_out_not_zero(tmp_path):
    answer = tmp_path / "smi"
    cells = ["0", "[N/A]", "100", "81559", "[Not Supported]", "40", "0x0", "[N/A]", "0", "0", "0"]
    answer.write_text(f"#!/bin/sh\necho '{', '.join(cells)}'\n")
    answer.chmod(0o755)
    found = _series(gpu_families("n", _plan(tmp_path, str(answer))))
    assert ("n", "0") not in found["slonk_gpu_utilization_ratio"]
    assert ("n", "0") not in found["slonk_gpu_power_watts"]
    assert found["slonk_gpu_memory_used_bytes"] == {("n", "0"): 100 * MIB}
    assert found["slonk_gpu_clock_event_reasons"] == {("n", "0"): 0}


def test_no_gpu_check_no_gpu_series(tmp_path):
    assert gpu_families("n", _plan(tmp_path, None)) == []
    assert gpu_families("n", tmp_path / "no-plan.json") == []


def test_a_gpu_nvidia_smi_cannot_reach_is_the_sources_error(tmp_path, scenario):
    scenario.write_text("lost\n")
    with pytest.raises(RecordError, match="Unable to determine the device handle"):
        gpu_families("n", _plan(tmp_path, f"{FAKE_GPU} nvidia-smi"))


def test_the_fake_refuses_a_field_it_does_not_know_as_the_real_one_does():
    fake = subprocess.run(
        [sys.executable, str(FAKE_GPU), "nvidia-smi", "--query-gpu=index,nonsense",
         "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False, env={**os.environ},
    )  # fmt: skip
    assert fake.returncode == 2
    assert fake.stderr.strip() == 'Field "nonsense" is not a valid field to query.'


def test_a_driver_before_r535_is_asked_with_the_reasons_old_name(tmp_path):
    answer = tmp_path / "smi"
    row = "0, 5, 100, 81559, 70.5, 40, 0x0000000000000004, 0, 0, 0, 0"
    answer.write_text(
        "#!/bin/sh\n"
        'case "$1" in *clocks_event_reasons*)\n'
        "  echo 'Field \"clocks_event_reasons.active\" is not a valid field to query.'; exit 2;;\n"
        "esac\n"
        f"echo '{row}'\n"
    )
    answer.chmod(0o755)
    found = _series(gpu_families("n", _plan(tmp_path, str(answer))))
    assert found["slonk_gpu_clock_event_reasons"] == {("n", "0"): 4}  # power cap


def test_nvlink_errors_by_kind_on_each_gpu(tmp_path, scenario):
    scenario.write_text("nvlink-rising\n")
    os.utime(scenario, (0, os.stat(scenario).st_mtime - 10))  # written 10 s ago
    (errors,) = nvlink_families("n", _plan(tmp_path, f"{FAKE_GPU} nvidia-smi"))
    assert errors.name == "slonk_gpu_nvlink_errors_total"
    # As a Hopper counts them: no CRC data errors (slonk.local.fake_gpu.FakeNvml).
    assert {labels[2] for labels in errors.samples} == {"crc", "replay", "recovery"}
    assert errors.samples[("n", "0", "crc")] == 0
    assert errors.samples[("n", "1", "crc")] >= 200  # 20 a second, for 10 s
    assert errors.samples[("n", "1", "replay")] == 0


def test_a_gpu_without_nvlink_has_no_nvlink_series(tmp_path):
    answer = tmp_path / "nvml"
    answer.write_text("#!/bin/sh\necho '0, [N/A], [N/A], [N/A], [N/A]'\n")
    answer.chmod(0o755)
    assert nvlink_families("n", _plan(tmp_path, "nvidia-smi", str(answer)))[0].samples == {}


def test_a_failing_nvlink_reader_is_its_own_sources_error(tmp_path):
    answer = tmp_path / "nvml"
    answer.write_text(
        "#!/bin/sh\necho 'NVML: libnvidia-ml.so.1: cannot open shared object'\nexit 9\n"
    )
    answer.chmod(0o755)
    with pytest.raises(RecordError, match=r"NVLink counters: NVML: libnvidia-ml\.so\.1"):
        nvlink_families("n", _plan(tmp_path, "nvidia-smi", str(answer)))
    assert nvlink_families("n", _plan(tmp_path, None)) == []
