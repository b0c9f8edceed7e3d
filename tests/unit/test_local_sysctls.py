"""Local mode sets a pod's network sysctls (securityContext.sysctls) in its network namespace,
as a runtime does, and refuses, named, one it does not set."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk.kube import chart
from slonk.local.manifests import LocalModeError, plan
from slonk.local.network import set_sysctls
from slonk.local.release import LOCAL_VALUES


def _pods(values: dict[str, Any]) -> dict[str, Any]:
    rendered = chart.render(chart.default_chart(), values)
    docs = [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]
    return {p.name: p for p in plan(docs, "default").pods}


def test_login_and_worker_pods_reserve_the_srun_ports():
    pods = _pods({})
    reserved = {"net.ipv4.ip_local_reserved_ports": "60001-63000"}
    assert pods["slonk-login-0"].sysctls == reserved
    assert pods["slonk-cpu-0"].sysctls == reserved
    assert pods["slonk-controller-0"].sysctls == {}


def test_local_mode_caps_time_wait_as_an_allowing_kubelet_would():
    pods = _pods(chart.user_values([LOCAL_VALUES]))
    assert pods["slonk-login-0"].sysctls["net.ipv4.tcp_max_tw_buckets"] == "1500"


def test_a_sysctl_outside_the_pods_network_is_refused():
    values = {"workers": {"podSecurityContext": {"sysctls": [
        {"name": "kernel.shm_rmid_forced", "value": "1"}]}}}  # fmt: skip
    with pytest.raises(
        LocalModeError, match=r"slonk-cpu: .*sysctls .*not 'kernel.shm_rmid_forced'"
    ):
        _pods(values)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_the_sysctl_is_set_in_the_pods_network_namespace_alone():
    name = f"slonk-sysctl-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        path = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
        before = path.read_text()
        set_sysctls(name, {"net.ipv4.ip_local_reserved_ports": "60001-63000"})
        inside = subprocess.run(
            ["ip", "netns", "exec", name, "cat", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert inside.strip() == "60001-63000"
        assert path.read_text() == before
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
