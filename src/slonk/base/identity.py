"""Who this pod is. Slurm knows nodes by their pod names: the StatefulSet's pod name, given
to the container as POD_NAME (the host name too, unless a runtime changed that)."""

from __future__ import annotations

import os
import socket


def pod_name() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()
