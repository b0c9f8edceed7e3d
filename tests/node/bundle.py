"""Cut the node acceptance test's bundle (tests/node/acceptance.py) from the built images.

The bundle is what a real node runs in the test, and nothing of the network or of the build
machine is needed there: one root filesystem (rootfs/, the daemons, their libraries, the
Slurm plugins, PAM, the images' Python with slonk) cut from the worker and controller
images, and the configuration the chart renders for each case (cases/<name>/): slurm.conf &
co. through `slonk render-config`, and pods.json, the controller's and the worker's
container as the rendered StatefulSets ask for it (capabilities, privileged, seccomp).

    tests/node/bundle.py [--out build/node] [--version X]    (as root: podman's store)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from slonk.config.render import write_config
from slonk.config.spec import load_spec
from slonk.kube import chart
from slonk.local.manifests import COMPONENT

HERE = Path(__file__).resolve().parent
# The cases a node may run, by what it offers (tests/node/acceptance.py picks one): the
# chart's default confinement, with and without a GPU, and `none` where no cgroup v2 is.
CASES: Mapping[str, list[str]] = {
    "cgroup-gpu": ["nodepools.cpu.gpus.count=1"],
    "cgroup": [],
    "none": ["slurm.confinement=none"],
}
# What the test runs in its pods, by path in the images (their libraries follow).
PROGRAMS = (
    "/usr/sbin/slurmd",
    "/usr/sbin/slurmstepd",
    "/usr/sbin/slurmctld",
    "/usr/sbin/munged",
    "/usr/sbin/sshd",
    "/usr/lib/openssh/sshd-session",
    "/usr/lib/openssh/sshd-auth",
    "/usr/bin/srun",
    "/usr/bin/sbatch",
    "/usr/bin/squeue",
    "/usr/bin/scontrol",
    "/usr/bin/sinfo",
    "/usr/bin/scancel",
    "/usr/bin/ssh",
    "/usr/bin/ssh-keygen",
    "/usr/bin/sh",
    "/usr/bin/dash",
    "/usr/bin/bash",
    "/usr/bin/env",
    "/usr/bin/cat",
    "/usr/bin/sleep",
    "/usr/bin/id",
    "/usr/bin/ls",
    "/usr/bin/mkdir",
    "/usr/bin/chown",
    "/usr/bin/chmod",
    "/usr/bin/rm",
    "/usr/bin/touch",
    "/usr/bin/head",
    "/usr/bin/grep",
    "/usr/bin/echo",
    "/usr/bin/test",
    "/usr/bin/[",
    "/usr/bin/stat",
    "/usr/bin/timeout",
    "/usr/bin/setpriv",
    "/usr/bin/mount",
    "/usr/bin/findmnt",
    "/usr/bin/python3.13",
    "/usr/bin/python3",
    "/usr/bin/true",
    "/usr/bin/false",
    "/usr/bin/hostname",
    "/usr/bin/df",
    "/usr/bin/dd",
    "/usr/bin/tr",
    "/usr/bin/wc",
    "/usr/bin/ln",
    "/usr/bin/cp",
    "/usr/bin/mv",
    "/usr/bin/sed",
    "/usr/bin/kill",
    "/usr/bin/ps",
    "/usr/bin/tail",
    "/usr/sbin/unix_chkpwd",
    "/usr/sbin/ldconfig",
    "/usr/bin/cut",
    # Apptainer in a job (and what tests/support/apptainer-image.sh builds an image with)
    "/usr/bin/apptainer",
    "/usr/lib/x86_64-linux-gnu/apptainer/bin/starter",
    "/usr/lib/x86_64-linux-gnu/apptainer/lib/offsetpreload.so",
    "/usr/bin/squashfuse_ll",
    "/usr/bin/mksquashfs",
    "/usr/bin/unsquashfs",
    "/usr/bin/ldd",
    "/etc/localtime",  # its link's target: Apptainer binds it into a container
    # merged /usr: the links on the way (the images' programs name /bin/sh, /lib64's loader)
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
)
# Whole trees: plugins and modules loaded by name, the configuration, slonk and its Python.
TREES = (
    "/usr/lib/x86_64-linux-gnu/slurm-wlm",
    "/usr/lib/x86_64-linux-gnu/security",
    "/etc",
    "/opt/slonk",
    "/usr/lib/python3.13",
    "/var/lib/munge",
    "/var/spool",
    "/var/lib/apptainer",
    "/var/tmp",
    "/var/log",
    "/usr/share/slonk",
    "/usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache",
    # glibc's compatibility stubs: the driver's programs a GPU node binds in (nvidia-smi) link them
    "/usr/lib/x86_64-linux-gnu/libpthread.so.0",
    "/usr/lib/x86_64-linux-gnu/libdl.so.2",
    "/usr/lib/x86_64-linux-gnu/librt.so.1",
    "/usr/lib/x86_64-linux-gnu/libutil.so.1",
    # which glibc loads when a thread exits (mksquashfs's threads, building an image)
    "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
    # PMIx, which mpi/pmix (the rendered MpiDefault) loads at each step's launch
    "/usr/lib/x86_64-linux-gnu/pmix2",
    "/usr/lib/x86_64-linux-gnu/libpmix.so.2",
)
PYTHON_SKIPPED = (
    "test",
    "idlelib",
    "tkinter",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "__pycache__",
    "turtledemo",
)


@contextmanager
def image_root(image: str) -> Iterator[Path]:
    """The image's files, mounted read-only from podman's store while in use."""
    container = subprocess.run(
        ["podman", "create", "--quiet", image, "true"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        mounted = subprocess.run(
            ["podman", "mount", container], check=True, capture_output=True, text=True
        ).stdout.strip()
        yield Path(mounted)
    finally:
        subprocess.run(["podman", "rm", "--force", container], capture_output=True, check=False)


def libraries(root: Path, program: str) -> set[str]:
    """The shared libraries `program` loads, by path in the image (the image's ldd)."""
    done = subprocess.run(
        ["chroot", str(root), "/usr/bin/ldd", program], capture_output=True, text=True, check=False
    )
    found = set()
    for line in done.stdout.splitlines():
        words = line.split()
        path = words[2] if len(words) > 2 and words[1] == "=>" else words[0] if words else ""
        if path.startswith("/"):
            found.add(path)
    return found


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(4) == b"\x7fELF"
    except OSError:
        return False


class Cut:
    """Paths copied from the images into the bundle's root, each with the links on its way."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.copied: set[str] = set()

    def add(self, root: Path, path: str) -> None:
        """Copy `path` (in the image at `root`) with every link that leads to it."""
        parts = PurePosixPath(path).parts[1:]
        here = PurePosixPath("/")
        for index, part in enumerate(parts):
            here = here / part
            source = root / here.relative_to("/")
            if source.is_symlink():
                self._copy(root, str(here))
                target = PurePosixPath(os.readlink(source))
                rest = PurePosixPath(*parts[index + 1 :]) if index + 1 < len(parts) else None
                resolved = target if target.is_absolute() else here.parent / target
                self.add(root, os.path.normpath(resolved / rest if rest else resolved))
                return
        self._copy(root, path)

    def _copy(self, root: Path, path: str) -> None:
        if path in self.copied:
            return
        source, target = root / path.lstrip("/"), self.out / path.lstrip("/")
        if not os.path.lexists(source):
            return
        self.copied.add(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            if not target.is_symlink():
                target.symlink_to(os.readlink(source))
        elif source.is_dir():
            target.mkdir(exist_ok=True)
            shutil.copystat(source, target)
            os.chown(target, source.stat().st_uid, source.stat().st_gid)
        else:
            shutil.copy2(source, target)
            os.chown(target, source.stat().st_uid, source.stat().st_gid)

    def add_tree(self, root: Path, top: str, skipped: Iterable[str] = ()) -> list[str]:
        """Copy a tree (links kept as links); its ELF files, for their libraries."""
        elves = []
        start = root / top.lstrip("/")
        if not start.exists():
            return elves
        self.add(root, top)
        for folder, dirs, files in os.walk(start):
            dirs[:] = [d for d in dirs if d not in skipped]
            for name in [*dirs, *files]:
                source = Path(folder, name)
                path = "/" + str(source.relative_to(root))
                self._copy(root, path)
                if name in files and not source.is_symlink() and _is_elf(source):
                    elves.append(path)
        return elves


def cut_rootfs(out: Path, worker: Path, controller: Path) -> None:
    cut = Cut(out)
    for root in (worker, controller):
        elves = [p for p in PROGRAMS if os.path.lexists(root / p.lstrip("/"))]
        for tree in TREES:
            elves += cut.add_tree(root, tree, PYTHON_SKIPPED if "python" in tree else ())
        for path in elves:
            cut.add(root, path)
            for library in libraries(root, path):
                cut.add(root, library)
    for top in ("proc", "sys", "dev", "run", "tmp", "home", "root"):
        (out / top).mkdir(exist_ok=True)
    (out / "tmp").chmod(0o1777)


def _rendered(overrides: list[str], values: Path) -> list[dict[str, Any]]:
    text = chart.template(None, [values], overrides, [], "slonk", "default")
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _container(statefulset: Mapping[str, Any], gpu_resource: str) -> dict[str, Any]:
    """The first container of a StatefulSet's pods as slonk.local.podinit reads it."""
    template = statefulset["spec"]["template"]
    container = template["spec"]["containers"][0]
    security = container.get("securityContext", {})
    limits = (container.get("resources") or {}).get("limits") or {}
    return {
        "name": f"{statefulset['metadata']['name']}-0",
        "capabilities": security.get("capabilities", {}).get("add", []),
        "dropCapabilities": security.get("capabilities", {}).get("drop", []),
        "privileged": security.get("privileged") is True,
        "noNewPrivileges": security.get("allowPrivilegeEscalation") is False,
        "seccomp": (
            security.get("seccompProfile")
            or template["spec"].get("securityContext", {}).get("seccompProfile")
            or {}
        ).get("type", ""),
        "annotations": template["metadata"].get("annotations", {}),
        "gpus": int(limits.get(gpu_resource, 0)),
        "env": {e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
    }


def render_case(out: Path, overrides: list[str], values: Path) -> None:
    docs = _rendered(overrides, values)
    cluster = next(
        d["data"]["cluster.yaml"]
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-cluster")
    )
    out.mkdir(parents=True)
    (out / "cluster.yaml").write_text(cluster)
    write_config(load_spec(out / "cluster.yaml"), out)
    gpu_resource = yaml.safe_load((HERE.parents[1] / "charts/slonk/values.yaml").read_text())[
        "workers"
    ]["gpuResource"]
    pods = {}
    for doc in docs:
        if doc["kind"] != "StatefulSet":
            continue
        component = doc["spec"]["template"]["metadata"]["labels"].get(COMPONENT)
        if component in ("controller", "worker"):
            pods[component] = _container(doc, gpu_resource)
    (out / "pods.json").write_text(json.dumps(pods, indent=1) + "\n")


def _app_version() -> str:
    """The images' tag: the chart's appVersion (as scripts/build-images tags them)."""
    meta = yaml.safe_load((HERE.parents[1] / "charts/slonk/Chart.yaml").read_text())
    return str(meta["appVersion"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE.parents[1] / "build" / "node")
    parser.add_argument("--version", default=_app_version())
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bundle.py: needs root (podman's store, chroot for ldd)", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".node-", dir=args.out.parent))
    try:
        with ExitStack() as stack:
            worker = stack.enter_context(image_root(f"localhost/slonk/worker:{args.version}"))
            controller = stack.enter_context(
                image_root(f"localhost/slonk/controller:{args.version}")
            )
            cut_rootfs(staging / "rootfs", worker, controller)
        for name, overrides in CASES.items():
            render_case(staging / "cases" / name, overrides, HERE / "values.yaml")
        if args.out.exists():
            shutil.rmtree(args.out)
        staging.rename(args.out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
