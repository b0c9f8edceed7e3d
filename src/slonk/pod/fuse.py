"""/dev/fuse in a worker pod, where a device plugin gave it one (values workers.fuseResource):
Apptainer in a user's job mounts SIF images through it, within the user's own namespace."""

from __future__ import annotations

import os
import stat

from slonk.base import paths

DEVICE = os.makedev(10, 229)  # /dev/fuse's number, the kernel's


def open_to_users() -> str:
    """The node opened to every user, as distributions make it (0666): a runtime hands it over
    with the machine's mode, which may be root's alone. Anything at that path but FUSE's
    device is left as it is, and so is a node a runtime will not let the pod change."""
    try:
        found = os.lstat(paths.FUSE_DEVICE)
    except FileNotFoundError:
        return "none in this pod"
    if not stat.S_ISCHR(found.st_mode) or found.st_rdev != DEVICE:
        return f"{paths.FUSE_DEVICE} is not FUSE's device (10:229): left as it is"
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o666 == 0o666:
        return f"open to users (mode {mode:04o})"
    try:
        os.chmod(paths.FUSE_DEVICE, mode | 0o666)
    except OSError as err:
        return f"left at mode {mode:04o}, users' containers cannot mount a SIF: {err.strerror}"
    return f"opened to users (mode {mode | 0o666:04o})"
