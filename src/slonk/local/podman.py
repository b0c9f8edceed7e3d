"""Run a local pod from its image with podman, in the pod's own network namespace.

The other way to run a pod (`slonk local up --runtime podman`): instead of the host's files
with rootfs/ layered over them, the container image the chart names, as a kubelet would run
it; the volumes, files and environment are the same. The podman command comes from
$SLONK_PODMAN (default `podman`), so a machine that needs a wrapper around it can give one.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slonk.base.errors import SlonkError
from slonk.local.network import NETNS_DIR


class PodmanError(SlonkError):
    pass


def podman(*args: str) -> str:
    command = [*shlex.split(os.environ.get("SLONK_PODMAN", "podman")), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise PodmanError(f"podman {args[0]}: {result.stderr.strip() or 'failed'}")
    return result.stdout.strip()


def image_layers(image: str) -> list[str]:
    """The directories of an image's layers in podman's store, top first: the lower layers of
    a host-runtime pod's root, as podman's own overlay would stack them."""
    try:
        (found,) = json.loads(podman("image", "inspect", image))
    except PodmanError as err:
        raise PodmanError(f"image {image} is not built (scripts/build-images): {err}") from None
    driver = found["GraphDriver"]
    if driver["Name"] != "overlay":
        raise PodmanError(f"the host runtime needs podman's overlay storage, not {driver['Name']}")
    lower = driver["Data"].get("LowerDir")
    return [driver["Data"]["UpperDir"], *(lower.split(":") if lower else [])]


def start(pod_dir: Path, netns: str, spec: Mapping[str, Any]) -> int:
    """Start the pod's container (named after its network namespace, unique per cluster);
    returns the host pid of its PID 1."""
    if spec.get("gpus"):
        raise PodmanError(
            f"pod {spec['hostname']} asks for GPUs: the fake device plugin is the host "
            "runtime's alone (slonk.local.podinit)"
        )
    files = pod_dir / "files"
    files.mkdir(exist_ok=True)
    volumes = [(v["source"], v["target"], v["readOnly"]) for v in spec["binds"]]
    for target, text in spec["files"].items():
        source = files / target.strip("/").replace("/", "_")
        source.write_text(text)
        volumes.append((str(source), target, True))
    command = spec["command"]
    argv = [
        "run", "--detach", "--replace", "--name", netns,
        "--network", f"ns:{NETNS_DIR / netns}", "--hostname", spec["hostname"], "--no-hosts",
        "--log-driver", "k8s-file", "--log-opt", f"path={pod_dir / 'log'}",
        *(f"--cap-drop={c}" for c in spec.get("dropCapabilities", [])),
        *(f"--cap-add={c}" for c in spec["capabilities"]),
        *(["--security-opt=no-new-privileges"] if spec.get("noNewPrivileges") else []),
        *(f"--tmpfs={t}:mode={mode}" for t, mode in spec["tmpfs"].items()),
        *(f"--device={d}" for d in spec.get("devices", [])),  # as a device plugin hands it
        *(f"--env={k}={v}" for k, v in spec["env"].items() if k != "PATH"),
        *(f"--volume={s}:{t}:{'ro' if ro else 'rw'}" for s, t, ro in volumes),
        f"--entrypoint={command[0]}", spec["image"], *command[1:],
    ]  # fmt: skip
    podman(*argv)
    return int(podman("inspect", "--format", "{{.State.Pid}}", netns))


def remove(netns: str) -> None:
    """The stopped container, so that a name is free and nothing is left behind."""
    podman("rm", "--force", "--ignore", netns)
