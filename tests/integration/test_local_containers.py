"""Containers in jobs (issue 33): Apptainer on the workers, run unprivileged in a user
namespace, with the machine's /dev/fuse that local mode hands workers as a device plugin would
(values workers.fuseResource). A user builds an image offline from a definition file in a job,
and runs it, as a SIF and as a sandbox directory, in srun and sbatch jobs on both workers. The
container gives a user nothing they lacked outside it: their own uid, no capability, no other
user's files, and --fakeroot's root is them on /home."""

from __future__ import annotations

import re
import shlex

import pytest

from ..support.cluster import LocalCluster, wait_for
from ..support.containers import SAID, build_in_a_job
from ..support.users import bystander

DIR = "containers"
IMAGES = (f"{DIR}/image.sif", f"{DIR}/image-dir")
ON_BOTH = "--nodes=2 --ntasks-per-node=1"


@pytest.fixture(scope="module")
def built(cluster: LocalCluster) -> str:
    cluster.wait_idle()
    build_in_a_job(cluster.user("demo"), DIR)
    return DIR


def _exec(image: str, script: str, *options: str) -> str:
    return f"apptainer --silent exec {' '.join(options)} {image} sh -c {shlex.quote(script)}"


@pytest.mark.parametrize("image", IMAGES, ids=["sif", "sandbox"])
def test_an_image_built_from_a_definition_file_runs_in_srun_on_both_workers(
    healthy: LocalCluster, built: str, image: str
):
    where = "echo $(cat /etc/slonk-image) on $(cat /proc/sys/kernel/hostname)"
    said = healthy.user("demo").check_output(f"srun {ON_BOTH} {_exec(image, where)} </dev/null")
    assert sorted(said.splitlines()) == [f"{SAID} on slonk-cpu-0", f"{SAID} on slonk-cpu-1"]


def test_a_batch_job_runs_the_image_on_both_workers(healthy: LocalCluster, built: str):
    demo = healthy.user("demo")
    steps = f"srun {ON_BOTH} apptainer --silent run {IMAGES[0]}"
    job = healthy.submit("--nodes=2", f"--output={DIR}/batch-%j.out", "--wrap", steps)
    wait_for(f"job {job} to finish", lambda: job not in healthy.jobs())
    assert demo.check_output(f"cat {DIR}/batch-{job}.out").splitlines() == [SAID, SAID]


def test_the_container_gives_a_user_nothing_they_lacked(healthy: LocalCluster, built: str):
    other = bystander(healthy)
    demo = healthy.user("demo")
    uid = demo.check_output("id -u")
    inside = demo.check_output(f"srun {_exec(IMAGES[0], 'cat /proc/self/status')} </dev/null")
    assert re.search(rf"^Uid:\s+{uid}\s+{uid}\s+{uid}\s+{uid}$", inside, re.M), inside
    assert re.findall(r"^Cap(?:Eff|Prm):\s+(\w+)$", inside, re.M) == ["0" * 16] * 2, inside
    # Another user's files stay theirs, all of /home bound into the container (Apptainer binds
    # the user's own home alone unless told).
    healthy.user(other).check_output("umask 077 && echo secret > container-secret")
    cat = _exec(IMAGES[0], f"cat /home/{other}/container-secret", "--bind /home")
    peek = demo.run(f"srun {cat} </dev/null")
    assert peek.rc != 0 and "Permission denied" in peek.stderr, peek
    assert "secret" not in peek.stdout
    # --fakeroot: root in the container, the user on the shared /home.
    write = f"id -u > /home/demo/{DIR}/by-fakeroot"
    demo.check_output(f"srun {_exec(IMAGES[0], write, '--fakeroot')} </dev/null")
    assert demo.check_output(f"cat {DIR}/by-fakeroot") == "0"
    assert demo.check_output(f"stat -c %u {DIR}/by-fakeroot") == uid
