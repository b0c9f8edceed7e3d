"""Sidecars as local stand-ins: local mode runs no sidecar image, but a process of its own
for the few it knows (see each stand-in module's docstring), in the pod's network namespace."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from slonk.local.manifests import LocalModeError, Pod
from slonk.local.network import NETNS_DIR
from slonk.local.pod import POD_PATH
from slonk.local.state import Cluster

# Sidecar images local mode can stand in for, and the module that does it.
SIDECAR_STAND_INS = {"git-sync": "slonk.local.gitsync"}


def sidecar_specs(cluster: Cluster, pod: Pod) -> list[dict[str, Any]]:
    """Each sidecar as a local stand-in process: its env, with volume paths made host paths."""
    specs = []
    for sidecar in pod.sidecars:
        module = next((m for image, m in SIDECAR_STAND_INS.items() if image in sidecar.image), None)
        if module is None:
            raise LocalModeError(
                f"pod {pod.name}: local mode cannot run sidecar {sidecar.name} ({sidecar.image})"
            )
        env = dict(sidecar.env)
        for mount in sidecar.mounts:
            host = str(cluster.mount_source(mount, pod.name))
            env = {k: v.replace(mount.target, host) for k, v in env.items()}
        specs.append({"name": sidecar.name, "module": module, "env": env})
    return specs


def start_sidecars(cluster: Cluster, name: str, sidecars: list[dict[str, Any]]) -> None:
    """Sidecars run in the pod's network namespace: `down` and `restart` stop them with it."""
    for sidecar in sidecars:
        with open(cluster.pod_dir(name) / f"{sidecar['name']}.log", "ab") as log:
            subprocess.Popen(
                [
                    "nsenter",
                    f"--net={NETNS_DIR / cluster.network.pod_netns(name)}",
                    "--",
                    sys.executable,
                    "-m",
                    sidecar["module"],
                ],
                env={"PATH": POD_PATH, **sidecar["env"]},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
