"""An Apptainer image built by a user in a job, offline, from a definition file
(tests/support/apptainer-image.sh): what the container tests run on workers."""

from __future__ import annotations

import base64
from pathlib import Path

from testinfra.host import Host

SCRIPT = Path(__file__).with_name("apptainer-image.sh")
SAID = "built from a definition file"  # the image's /etc/slonk-image and its runscript


def build_in_a_job(user: Host, directory: str, *srun_args: str) -> None:
    """DIR/image.sif and the sandbox DIR/image-dir, built by `user` in one job step."""
    encoded = base64.b64encode(SCRIPT.read_bytes()).decode()
    user.check_output(f"mkdir -p {directory} && echo {encoded} | base64 -d > {directory}/build.sh")
    user.check_output(f"srun {' '.join(srun_args)} sh {directory}/build.sh {directory} </dev/null")
