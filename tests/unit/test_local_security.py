"""Local pods start under their container's securityContext, as a container runtime would:
the capabilities the chart renders and no others, no_new_privs where it forbids privilege
escalation, and the runtime's default seccomp filter where it asks for it."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from slonk.kube import chart
from slonk.local import seccomp
from slonk.local.manifests import Pod, plan
from slonk.local.podinit import RUNTIME_DEFAULT_CAPABILITIES, capabilities, confined

LOCAL_VALUES = {"slurm": {"confinement": "none"}, "ldap": {"dev": {"enabled": True}}}


def _render(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    rendered = chart.render(chart.default_chart(), dict(values))
    return [d for d in yaml.safe_load_all(chart.manifest(rendered)) if d]


def _spec(pod: Pod) -> dict[str, Any]:
    """What podspec keeps of a pod's securityContext in pod.json."""
    return {
        "capabilities": list(pod.capabilities),
        "dropCapabilities": list(pod.drop_capabilities),
        "privileged": pod.privileged,
        "noNewPrivileges": pod.no_new_privileges,
        "seccomp": pod.seccomp_profile,
    }


def _rendered_security(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each StatefulSet's first pod name -> its main container's rendered securityContext."""
    return {
        f"{d['metadata']['name']}-0": d["spec"]["template"]["spec"]["containers"][0].get(
            "securityContext", {}
        )
        for d in docs
        if d["kind"] == "StatefulSet"
    }


@pytest.mark.parametrize(
    "values", [LOCAL_VALUES, {**LOCAL_VALUES, "workers": {"ssh": {"enabled": True}}}]
)
def test_every_pod_gets_exactly_the_capabilities_its_container_renders(values):
    docs = _render(values)
    rendered = _rendered_security(docs)
    pods = {p.name: p for p in plan(docs, "default").pods}
    assert {"slonk-controller-0", "slonk-cpu-0", "slonk-login-0"} <= rendered.keys()
    for name, security in rendered.items():
        assert security["capabilities"]["drop"] == ["ALL"], name
        assert capabilities(_spec(pods[name])) == sorted(security["capabilities"]["add"]), name
        assert pods[name].no_new_privileges == (security.get("allowPrivilegeEscalation") is False)
        assert pods[name].seccomp_profile == "RuntimeDefault", name


def test_the_roles_keep_what_the_chart_gives_them_and_nothing_of_the_hosts():
    pods = {p.name: p for p in plan(_render(LOCAL_VALUES), "default").pods}
    login, worker = _spec(pods["slonk-login-0"]), _spec(pods["slonk-cpu-0"])
    assert "SYS_CHROOT" in capabilities(login) and "SYS_ADMIN" not in capabilities(login)
    assert login["noNewPrivileges"]
    assert "SYS_ADMIN" in capabilities(worker) and not worker["noNewPrivileges"]
    for spec in (login, worker, _spec(pods["slonk-controller-0"])):
        assert not {"SYS_MODULE", "SYS_RAWIO", "SYS_BOOT", "MKNOD"} & set(capabilities(spec))


def test_a_privileged_worker_keeps_every_capability_but_only_in_its_user_namespace():
    pods = plan(_render({**LOCAL_VALUES, "workers": {"privileged": True}}), "default").pods
    worker = next(p for p in pods if p.name == "slonk-cpu-0")
    assert worker.privileged and capabilities(_spec(worker)) is None
    assert confined(["slonk", "init"], _spec(worker)) == ["slonk", "init"]


def test_a_container_that_drops_less_than_all_keeps_the_runtimes_default_set():
    spec = {"capabilities": ["SYS_NICE"], "dropCapabilities": ["NET_RAW"], "privileged": False}
    kept = capabilities(spec)
    assert kept == sorted({*RUNTIME_DEFAULT_CAPABILITIES, "SYS_NICE"} - {"NET_RAW"})
    # A pod.json from before `privileged` was kept: one naming nothing was privileged.
    assert capabilities({"capabilities": [], "dropCapabilities": []}) is None


def test_a_pod_that_drops_all_keeps_only_what_it_adds():
    spec = {
        "capabilities": ["SETUID", "KILL"],
        "dropCapabilities": ["ALL"],
        "privileged": False,
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


CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x20000
NR_UNSHARE, NR_KEYCTL, NR_FINIT_MODULE, NR_GETPID = 272, 250, 313, 39


def _under_filter(caps: list[str] | None, calls: list[tuple[int, int]]) -> list[int]:
    """In a child under the filter for `caps`: each (syscall, arg) call's errno (0: done)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - reported through the pipe
        os.close(read)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: needed without SYS_ADMIN
        seccomp.install(caps)
        errnos = []
        for nr, arg in calls:
            errnos.append(0 if libc.syscall(nr, arg, 0, 0) >= 0 else ctypes.get_errno())
        os.write(write, " ".join(map(str, errnos)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answers:
        found = answers.read()
    os.waitpid(child, 0)
    return [int(e) for e in found.split()]


@pytest.mark.skipif(not seccomp.supported(), reason="the filter is written for x86_64")
def test_the_filter_refuses_the_machines_calls_and_namespaces_without_sys_admin():
    calls = [(NR_UNSHARE, CLONE_NEWUSER), (NR_KEYCTL, 0), (NR_FINIT_MODULE, -1), (NR_GETPID, 0)]
    eperm = 1
    assert _under_filter(["CHOWN", "SETUID"], calls) == [eperm, eperm, eperm, 0]
    # SYS_ADMIN's pods (workers, for cgroups and per-job mounts) may make namespaces.
    unshare, *_ = _under_filter(["SYS_ADMIN"], [(NR_UNSHARE, CLONE_NEWNS)])
    assert unshare != eperm
