"""From a rendered pod to the spec a local runtime starts (pod.json: slonk.local.podinit for
the host runtime, slonk.local.podman from the images): its root, mounts, env and sidecars."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import slonk
from slonk.base import paths
from slonk.local import fake_apiserver, podman
from slonk.local.manifests import LocalModeError, Pod
from slonk.local.network import BRIDGE_ADDRESS
from slonk.local.pod import POD_PATH
from slonk.local.sidecars import sidecar_specs
from slonk.local.state import Cluster

POD_TMPFS = {"/run": "0755", "/tmp": "1777"}
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _development_binds(layers: Sequence[str]) -> list[dict[str, Any]]:
    """From a checkout, its code in place of the image's copy (so that a change needs no
    image rebuild), and the checkout itself read-only at its own path (values may name its
    files: the tests' fake nvidia-smi). Nothing when slonk runs from an install."""
    checkout = paths.checkout()
    if checkout is None:
        return []
    installed = [
        str(Path("/", *p.relative_to(layer).parts))
        for layer in layers
        for p in Path(layer).glob("opt/slonk/lib/python3*/site-packages/slonk")
    ]
    if not installed:
        raise LocalModeError("the image has no slonk in /opt/slonk (scripts/build-images)")
    code = Path(slonk.__file__).parent
    return [
        {"source": str(checkout), "target": str(checkout), "readOnly": True},
        {"source": str(code), "target": installed[0], "readOnly": True},
    ]


# Asked once per image, not per pod (a podman call each): `up` and `upgrade` are one short
# command, and the images do not change under it.
_image_layers = functools.cache(podman.image_layers)


def pod_spec(cluster: Cluster, pod: Pod, hosts: str, runtime: str) -> dict[str, Any]:
    for device in pod.devices:  # the machine's own, as its device plugin would hand it over
        if not os.path.exists(device):
            raise LocalModeError(
                f"pod {pod.name} asks for {device}, and this machine has none (for /dev/fuse: "
                f'`modprobe fuse`, or workers.fuseResource: "")'
            )
    layers: list[str] = _image_layers(pod.image) if runtime == "host" else []
    rootfs = paths.rootfs_dir() if paths.checkout() else None
    binds = _development_binds(layers) if runtime == "host" else []
    # What a host-runtime pod binds from the checkout must not show it the state directory.
    for bind in binds:
        if cluster.state_dir.is_relative_to(bind["source"]):
            raise LocalModeError(
                f"state dir {cluster.state_dir} lies in {bind['source']}, which pods see: "
                "choose another"
            )
    for mount in pod.mounts:
        source = cluster.mount_source(mount, pod.name)
        binds.append({"source": str(source), "target": mount.target, "readOnly": mount.read_only})
    env = {"PATH": POD_PATH, "HOME": "/root", "LANG": "C.UTF-8", **pod.env}
    if pod.service_account:
        account = cluster.serviceaccount_dir(pod.service_account)
        binds.append({"source": str(account), "target": SERVICE_ACCOUNT_DIR, "readOnly": True})
        env |= {
            "KUBERNETES_SERVICE_HOST": BRIDGE_ADDRESS,
            "KUBERNETES_SERVICE_PORT": str(fake_apiserver.PORT),
        }
    pod_layers = cluster.pod_dir(pod.name) / "layers"
    return {
        "hostname": pod.name,
        "image": pod.image,
        "capabilities": list(pod.capabilities),
        "dropCapabilities": list(pod.drop_capabilities),
        "privileged": pod.privileged,
        "seccomp": pod.seccomp_profile,
        "noNewPrivileges": pod.no_new_privileges,
        # The host runtime's pods run in a user namespace of their own (slonk.local.podinit).
        "userNamespace": runtime == "host",
        "command": list(pod.command),
        "preStop": list(pod.pre_stop),
        "terminationGracePeriodSeconds": pod.grace_seconds,
        "env": env,
        # Host runtime: the image's layers under the pod's own (from a checkout, its rootfs/
        # on top, as the images' last layer copies it), mounted at `target` and pivoted into.
        "root": {
            "lower": [*([str(rootfs)] if rootfs else []), *layers],
            "upper": str(pod_layers / "upper"),
            "work": str(pod_layers / "work"),
            "target": str(pod_layers / "root"),
        },
        "tmpfs": POD_TMPFS,
        "binds": binds,
        "files": {"/etc/hosts": hosts, "/etc/hostname": f"{pod.name}\n"},
        "sidecars": sidecar_specs(cluster, pod),
        "sysctls": dict(pod.sysctls),
        "gpus": pod.gpus,
        "devices": list(pod.devices),
    }
