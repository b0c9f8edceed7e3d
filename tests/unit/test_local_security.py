"""Local pods start under their container's securityContext, as a container runtime would."""

from __future__ import annotations

import yaml

from slonk import chart
from slonk.local.manifests import plan
from slonk.local.podinit import confined


def _pods(values: dict | None = None):
    rendered = chart.render(chart.default_chart(), values or {})
    docs = [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]
    return {p.name: p for p in plan(docs, "default").pods}


def test_pods_carry_their_capabilities_and_no_new_privs():
    pods = _pods()
    login = pods["slonk-login-0"]
    assert login.drop_capabilities == ("ALL",)
    assert "SYS_CHROOT" in login.capabilities and "SYS_ADMIN" not in login.capabilities
    assert login.no_new_privileges
    worker = pods["slonk-cpu-0"]
    assert worker.drop_capabilities == ("ALL",) and "SYS_ADMIN" in worker.capabilities
    assert not worker.no_new_privileges


def test_a_pod_that_drops_all_keeps_only_what_it_adds():
    spec = {
        "capabilities": ["KILL", "SETUID"],
        "dropCapabilities": ["ALL"],
        "noNewPrivileges": True,
    }
    assert confined(["slonk", "init"], spec) == [
        "setpriv",
        "--bounding-set",
        "-all,+kill,+setuid",
        "--inh-caps",
        "-all",
        "--no-new-privs",
        "--",
        "slonk",
        "init",
    ]


def test_a_pod_that_drops_nothing_keeps_roots_capabilities():
    spec = {"capabilities": ["SYS_ADMIN"], "dropCapabilities": [], "noNewPrivileges": False}
    assert confined(["slonk", "init"], spec) == ["slonk", "init"]
