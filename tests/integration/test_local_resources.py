"""Memory is a resource Slurm schedules and holds jobs to, as a pod's memory limit would
(slurm.conf's CR_Core_Memory, each partition's DefMemPerCPU, and with confinement none the
accounting sampler's OverMemoryKill); and each job's /tmp and /dev/shm are its own. The local
pool: 4 CPUs and 1024 MiB a node."""

from __future__ import annotations

import re
import uuid

from slonk.base.paths import JOB_TMP_BASE

from ..support.cluster import LocalCluster, wait_for
from ..support.users import bystander

NODE = "slonk-cpu-0"


def _job_field(cluster: LocalCluster, job: str, field: str) -> str:
    """One `Key=value` of `scontrol show job` ("" while the job is unknown)."""
    out = cluster.pod("slonk-controller-0").run(f"scontrol show job {job}")
    for word in out.stdout.split():
        key, _, value = word.partition("=")
        if key == field:
            return value
    return ""


def test_more_memory_than_a_node_has_is_refused_at_once(healthy: LocalCluster):
    refused = healthy.user().run("sbatch --mem=2048M --wrap true")
    assert refused.rc != 0
    assert "Memory specification can not be satisfied" in refused.stderr, refused.stderr


def test_jobs_that_do_not_fit_together_take_turns(healthy: LocalCluster):
    first = healthy.submit(f"--nodelist={NODE}", "--mem=700M", "--wrap", "sleep 300")
    wait_for(f"job {first} running", lambda: healthy.jobs().get(first) == "RUNNING")
    second = healthy.submit(f"--nodelist={NODE}", "--mem=700M", "--wrap", "true")
    # CPUs are free (1 of 4 taken); memory is not.
    wait_for(
        f"job {second} waiting for memory",
        lambda: _job_field(healthy, second, "Reason") == "Resources",
    )
    assert healthy.jobs()[first] == "RUNNING"
    healthy.pod("slonk-controller-0").check_output(f"scancel {first}")
    wait_for(f"job {second} to run and end", lambda: second not in healthy.jobs())


def test_a_job_asking_no_memory_gets_its_share_of_the_node(healthy: LocalCluster):
    """DefMemPerCPU: 1024 MiB / 4 CPUs, so that four such jobs fill a node exactly."""
    job = healthy.submit(f"--nodelist={NODE}", "--ntasks=2", "--wrap", "sleep 300")
    wait_for(f"job {job} running", lambda: healthy.jobs().get(job) == "RUNNING")
    assert _job_field(healthy, job, "MinMemoryCPU") == "256M"


def test_a_job_using_more_than_it_asked_is_stopped(healthy: LocalCluster):
    # Written, not just allocated: untouched pages use no memory.
    grow = "python3 -c 'import time; b = b\"x\" * (300 << 20); time.sleep(300)'"
    out = "/home/demo/grow-%j.out"
    job = healthy.submit(f"--nodelist={NODE}", "--mem=100M", f"--output={out}", "--wrap", grow)

    def ended() -> str:
        state = _job_field(healthy, job, "JobState")
        return "" if state in ("", "PENDING", "RUNNING", "COMPLETING") else state

    # The sampler looks every JobAcctGatherFrequency (30 s): this waits on its verdict.
    assert wait_for(f"job {job} stopped", ended, timeout=120) == "FAILED"
    said = healthy.user().file(out.replace("%j", job)).content_string
    # Slurm says it either way: "StepId=N.batch exceeded memory limit (used > limit), being
    # killed" (the sampler) and, in most runs, also "Exceeded job memory limit".
    assert re.search(r"[Ee]xceeded (job )?memory limit", said), said


def test_a_jobs_tmp_and_shm_are_its_own_and_go_with_it(healthy: LocalCluster):
    """job_container/tmpfs (slonk's default): the job's steps share its /tmp and /dev/shm;
    another user's job on the node, and the node itself, never see them; they go when it
    ends."""
    other = bystander(healthy)
    tag = f"secret-{uuid.uuid4().hex}"
    write = f"echo mine > /tmp/{tag} && echo mine > /dev/shm/{tag} && touch $HOME/{tag}"
    job = healthy.submit(
        f"--nodelist={NODE}", "--output=/dev/null", "--wrap", f"{write} && sleep 300"
    )
    try:
        wait_for(f"job {job}'s files", lambda: healthy.user().run(f"test -e {tag}").rc == 0)
        # Another step of the job joins its namespace.
        step = healthy.user().check_output(f"srun --jobid={job} --overlap ls /tmp /dev/shm")
        assert step.split().count(tag) == 2, step
        # Another user's job beside it sees neither: its /tmp and /dev/shm hold nothing but
        # its own step's PMIx directory (slurmstepd runs in the job's namespace).
        beside = healthy.user(other).check_output(
            f"srun --nodelist={NODE} --mem=64M ls -A /tmp /dev/shm"
        )
        entries = [e for e in beside.split() if not e.endswith(":")]
        assert [e for e in entries if not e.startswith("spmix_appdir_")] == [], beside
        # Nor does the node: the pod's own /tmp and /dev/shm never held them.
        assert tag not in healthy.pod(NODE).check_output("ls -A /tmp /dev/shm")
    finally:
        healthy.pod("slonk-controller-0").run(f"scancel {job}")
        healthy.user().run(f"rm -f {tag}")
    wait_for(f"job {job} to end", lambda: job not in healthy.jobs())
    left = healthy.pod(NODE).check_output(f"find {JOB_TMP_BASE} -name {tag}")
    assert left == "", left
