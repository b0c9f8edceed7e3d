"""Inside a new local pod's namespaces: lay out its filesystem, then exec its command.

Run by `slonk local` as PID 1 of a fresh PID, mount and UTS namespace (already joined to
the pod's network namespace). The host's root is the pod's image, with the image's own
files (rootfs/) layered over /etc and /usr, and a writable layer per pod over /etc and /var,
as a container runtime would do. Every mount dies with the pod's mount namespace.

The host's root is visible in the pod, and with it the state directory of `slonk local`
(the controller's ServiceAccount token, every pod's Secrets and layers, the client SSH key),
at its host path: directly, through the /var overlay's lower layer, or under a checkout bound
back in. Once the binds that could show it are made (from file descriptors opened before,
so they keep their sources), each path in `hide` is covered by an empty tmpfs, read-only
once the binds whose targets lie under it are made. Users in the pod cannot unmount it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def overlay(target: str, lower: list[str], upper: str | None, work: str | None) -> None:
    options = f"lowerdir={':'.join(lower)}"
    if upper and work:
        options += f",upperdir={upper},workdir={work}"
    _mount("-t", "overlay", "overlay", "-o", options, target)


def bind(source_fd: int, target: str, read_only: bool) -> None:
    Path(target).mkdir(parents=True, exist_ok=True)
    # --no-canonicalize: mount would otherwise resolve the fd back to its path name, which
    # inside the pod may now name the overlay's copy (a state dir under /var) instead.
    _mount("--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{source_fd}", target)
    if read_only:
        _mount("-o", "remount,bind,ro", target)


def confined(command: list[str], spec: dict) -> list[str]:
    """The command under the container's securityContext, as a runtime would start it: with
    `drop: [ALL]`, root keeps only the added capabilities (and so does everything it starts);
    without, the pod keeps all of root's. allowPrivilegeEscalation false sets no_new_privs."""
    options = []
    if "ALL" in spec.get("dropCapabilities", []):
        keep = "".join(f",+{c.lower()}" for c in spec["capabilities"])
        options += ["--bounding-set", f"-all{keep}", "--inh-caps", "-all"]
    if spec.get("noNewPrivileges"):
        options.append("--no-new-privs")
    return ["setpriv", *options, "--", *command] if options else command


def _under(target: str, hidden: list[str]) -> bool:
    return any(Path(target).is_relative_to(path) for path in hidden)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    # Hold every volume's source before the pod's own /tmp or /run, or the hiding, covers it.
    sources = [os.open(v["source"], os.O_PATH | os.O_DIRECTORY) for v in spec["binds"]]
    for layer in spec["overlays"]:
        overlay(layer["target"], layer["lower"], layer.get("upper"), layer.get("work"))
    for target, mode in spec["tmpfs"].items():
        _mount("-t", "tmpfs", "-o", f"mode={mode}", "tmpfs", target)
    hide = spec.get("hide", [])
    binds = list(zip(sources, spec["binds"], strict=True))
    for fd, volume in [b for b in binds if not _under(b[1]["target"], hide)]:
        bind(fd, volume["target"], volume["readOnly"])
    hidden = [path for path in hide if Path(path).is_dir()]  # as the pod sees it by now
    for path in hidden:
        _mount("-t", "tmpfs", "-o", "mode=0755,size=64k", "slonk-hidden", path)
    for fd, volume in [b for b in binds if _under(b[1]["target"], hide)]:
        bind(fd, volume["target"], volume["readOnly"])
    for path in hidden:
        _mount("-o", "remount,ro", path)
    for fd in sources:
        os.close(fd)
    for path, text in spec["files"].items():
        Path(path).write_text(text)
    socket.sethostname(spec["hostname"])
    os.chdir("/")
    command = confined(spec["command"], spec)
    os.execvpe(command[0], command, spec["env"])


if __name__ == "__main__":
    main(sys.argv[1])
