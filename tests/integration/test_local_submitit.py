"""submitit as a researcher uses it from the login pod: installed in a venv in their home,
Python functions sent as jobs, their states learnt from sacct (Slurm accounting).

Pods reach no package index: scripts/setup fetched the wheels into the checkout, which local
pods see read-only at its own path."""

from __future__ import annotations

import shlex

from slonk.base import paths

from ..support.cluster import LocalCluster

WHEELS = paths.checkout() / "build" / "client-wheels"  # type: ignore[operator]
VENV = "~/venv-submitit"
# What the test asks of submitit, printed one result a line. Every wait in it ends on a job
# state Slurm reports; the shell's `timeout` bounds the whole.
SCRIPT = """\
import time

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError


def add(a, b):
    return a + b


def fail():
    raise ValueError("boom from a job")


def linger():
    time.sleep(600)


executor = submitit.AutoExecutor(folder="submitit-logs/%j", cluster="slurm")
executor.update_parameters(timeout_min=10, slurm_partition="main")
print("submit", executor.submit(add, 2, 3).result())
jobs = executor.map_array(add, [1, 2, 3], [10, 20, 30])
print("map_array", [job.result() for job in jobs])
try:
    executor.submit(fail).result()
except FailedJobError as err:
    print("failed", "boom from a job" in str(err))
job = executor.submit(linger)
while job.get_info().get("State") != "RUNNING":  # asks sacct each time
    time.sleep(0.5)
job.cancel()
try:
    job.result()
except UncompletedJobError:
    print("cancelled", job.state.split()[0])  # sacct: "CANCELLED by <uid>"
"""


def test_submitit_runs_maps_fails_and_cancels(healthy: LocalCluster):
    user = healthy.user()
    user.check_output(
        f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --no-index "
        f"--find-links {shlex.quote(str(WHEELS))} submitit"
    )
    user.check_output(f"cat > ~/submitit_check.py <<'PY'\n{SCRIPT}PY")
    out = user.run(f"cd && timeout 300 {VENV}/bin/python submitit_check.py")
    assert out.rc == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "submit 5",
        "map_array [11, 22, 33]",
        "failed True",
        "cancelled CANCELLED",
    ], out.stdout + out.stderr
