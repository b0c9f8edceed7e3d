"""Local mode's device plugins: a pool's GPU limit becomes that many null devices and a fake
nvidia-smi in the pod, a FUSE limit the machine's own /dev/fuse; a device plugin local mode
has none of stops the plan, named."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from slonk.kube import chart
from slonk.local import fake_gpu, manifests, podinit, podspec
from slonk.local.manifests import LocalModeError, plan

GPU_POOL = {"gpu": {"replicas": 1, "cpus": 2, "memoryMiB": 1024, "gpus": {"count": 2}}}


def _pods(values: dict[str, Any]) -> dict[str, Any]:
    rendered = chart.render(chart.default_chart(), values)
    docs = [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]
    return {p.name: p for p in plan(docs, "default").pods}


def test_a_gpu_pools_pods_ask_the_fake_device_plugin_for_their_gpus():
    pods = _pods({"nodepools": GPU_POOL, "partitions": {"main": {"pools": ["cpu", "gpu"]}}})
    assert pods["slonk-gpu-0"].gpus == 2
    assert pods["slonk-cpu-0"].gpus == 0
    assert pods["slonk-controller-0"].gpus == 0


def test_a_device_plugin_local_mode_has_no_fake_of_is_refused():
    values = {
        "nodepools": GPU_POOL,
        "partitions": {"main": {"pools": ["gpu"]}},
        "workers": {"gpuResource": "amd.com/gpu"},
    }
    with pytest.raises(LocalModeError, match=r"no device plugin for 'amd.com/gpu'.*nvidia.com/gpu"):
        _pods(values)


def test_workers_asking_for_fuse_get_the_machines_dev_fuse(tmp_path: Path, monkeypatch):
    """The plan hands /dev/fuse to each worker (no other pod asks); a machine without one is
    found out as the pod starts, named, before anything of it runs."""
    pods = _pods({"workers": {"fuseResource": manifests.FUSE_RESOURCE}})
    assert pods["slonk-cpu-0"].devices == ("/dev/fuse",)
    assert pods["slonk-login-0"].devices == pods["slonk-controller-0"].devices == ()
    assert _pods({})["slonk-cpu-0"].devices == ()
    absent = dataclasses.replace(pods["slonk-cpu-0"], devices=(str(tmp_path / "fuse"),))
    with pytest.raises(LocalModeError, match=r"pod slonk-cpu-0 asks for .*/fuse, and this"):
        podspec.pod_spec(cast(Any, None), absent, "", "podman")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_the_pod_gets_null_devices_and_the_fake_nvidia_smi(tmp_path: Path):
    for folder in ("dev", "usr/bin"):
        (tmp_path / folder).mkdir(parents=True)
    podinit.fake_gpus(str(tmp_path), 3)
    names = sorted(p.name for p in (tmp_path / "dev").iterdir())
    assert names == ["nvidia0", "nvidia1", "nvidia2", "nvidiactl"]
    for name in names:
        mode = os.stat(tmp_path / "dev" / name).st_rdev
        assert stat.S_ISCHR(os.stat(tmp_path / "dev" / name).st_mode)
        assert (os.major(mode), os.minor(mode)) == (1, 3)  # /dev/null's: no real GPU
    smi = (tmp_path / "usr/bin/nvidia-smi").read_text()
    assert "FAKE_GPU_COUNT=3" in smi and "slonk.local.fake_gpu nvidia-smi" in smi


def test_no_gpus_no_devices(tmp_path: Path):
    podinit.fake_gpus(str(tmp_path), 0)
    assert list(tmp_path.iterdir()) == []


def _smi(*args: str, count: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAKE_GPU_COUNT": count, "FAKE_GPU_SCENARIO": "/nonexistent"}
    command = [sys.executable, "-m", "slonk.local.fake_gpu", "nvidia-smi", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def test_the_fake_lists_the_gpus_it_was_given():
    listed = _smi("-L", count="4").stdout.splitlines()
    assert [line.split(":")[0] for line in listed] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    buses = _smi("--query-gpu=pci.bus_id", fake_gpu.FORMAT, count="3").stdout.split()
    assert len(set(buses)) == 3
    assert len(_smi("-L").stdout.splitlines()) == fake_gpu.DEFAULT_COUNT


@pytest.mark.parametrize("args", [(), ("-q",), ("--query-gpu=name",), ("-L", "-i", "0")])
def test_the_fake_refuses_what_it_does_not_implement(args):
    refused = _smi(*args)
    assert refused.returncode == 2
    assert "is not implemented" in refused.stderr
