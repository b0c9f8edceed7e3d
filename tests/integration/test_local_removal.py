"""Safe removal of a worker pod on a real local cluster: deleting (restarting) the pod runs its
preStop hook (`slonk worker stop`, slonk.pod.worker_stop) before SIGTERM, as kubelet does. Its
node is drained, its jobs finish, or are requeued after workers.drainTimeoutSeconds (the
session cluster's DRAIN_TIMEOUT), and the node comes back with the new pod without slonk's
drain; a person's drain outlives the pod."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

from slonk.slurm import reasons

from ..support.cluster import SLONK, LocalCluster, wait_for

NODE = "slonk-cpu-1"
CONTROLLER = "slonk-controller-0"
POD_DRAIN = f"{reasons.PREFIX}{reasons.POD}: "


def _job(cluster: LocalCluster, job: str) -> dict[str, Any]:
    """The job's record as slurmctld keeps it (ended ones too, for MinJobAge)."""
    out = cluster.pod(CONTROLLER).check_output(f"scontrol show job --json {job}")
    (record,) = json.loads(out)["jobs"]
    return record


@contextlib.contextmanager
def _restarting(cluster: LocalCluster, pod: str) -> Iterator[subprocess.Popen[str]]:
    """`slonk local restart POD` running (it returns once the new pod started)."""
    restart = subprocess.Popen(
        [*SLONK, "local", "restart", pod, "--state-dir", str(cluster.state_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield restart
    finally:
        output, _ = restart.communicate(timeout=300)
        assert restart.returncode == 0, output


def _back_idle(cluster: LocalCluster, before: str) -> None:
    """A new slurmd registered and the node is idle, undrained."""
    wait_for(f"a new slurmd on {NODE}", lambda: cluster.slurmd_started(NODE) not in ("", before))
    cluster.wait_idle((NODE,))
    assert not cluster.node_states()[NODE].drained


def test_a_running_job_finishes_before_its_pod_stops(healthy: LocalCluster):
    go = "/home/demo/go-$SLURM_JOB_ID"
    job = healthy.submit(
        f"--nodelist={NODE}", "--output=/home/demo/removal-%j.out",
        "--wrap", f"while [ ! -e {go} ]; do sleep 0.1; done; echo finished",
    )  # fmt: skip
    wait_for(f"job {job} running", lambda: healthy.jobs().get(job) == "RUNNING")
    before = healthy.slurmd_started(NODE)
    with _restarting(healthy, NODE) as restart:
        wait_for(
            f"{NODE} drained by its stopping pod",
            lambda: healthy.nodes().get(NODE, ("", ""))[1].startswith(POD_DRAIN),
        )
        assert healthy.jobs().get(job) == "RUNNING"  # no new job lands, the old one runs on
        assert restart.poll() is None, "the pod stopped under its job"
        healthy.user().check_output(f"touch /home/demo/go-{job}")
    record = _job(healthy, job)
    assert record["job_state"] == ["COMPLETED"], record["job_state"]
    assert record["exit_code"]["return_code"]["number"] == 0
    assert record["restart_cnt"] == 0
    assert healthy.user().file(f"/home/demo/removal-{job}.out").content_string == "finished\n"
    _back_idle(healthy, before)


def test_a_job_longer_than_the_drain_timeout_is_requeued(healthy: LocalCluster):
    requeued = healthy.submit(f"--nodelist={NODE}", "--output=/dev/null", "--wrap", "sleep 600")
    interactive_like = healthy.submit(
        "--no-requeue", f"--nodelist={NODE}", "--output=/dev/null", "--wrap", "sleep 600"
    )
    for job in (requeued, interactive_like):
        wait_for(f"job {job} running", lambda job=job: healthy.jobs().get(job) == "RUNNING")
    before = healthy.slurmd_started(NODE)
    healthy.slonk("restart", NODE)  # waits the drain timeout out
    record = _job(healthy, requeued)
    assert record["restart_cnt"] == 1
    assert record["job_state"][0] in ("PENDING", "RUNNING"), record["job_state"]
    # Slurm refuses to requeue it: cancelled as the pod went, not left to a lost node.
    assert _job(healthy, interactive_like)["job_state"] == ["CANCELLED"]
    healthy.pod(CONTROLLER).check_output(f"scancel {requeued}")
    _back_idle(healthy, before)


def test_a_persons_drain_survives_the_restart(healthy: LocalCluster):
    controller = healthy.pod(CONTROLLER)
    controller.check_output(f"scontrol update nodename={NODE} state=drain reason=maintenance")
    try:
        before = healthy.slurmd_started(NODE)
        healthy.slonk("restart", NODE)
        wait_for(f"a new slurmd on {NODE}", lambda: healthy.slurmd_started(NODE) != before)
        node = wait_for(
            f"{NODE} up", lambda: (n := healthy.node_states().get(NODE)) and n.up and n
        )  # the new pod's release lifts only its own kind of drain
        assert node.drained and node.reason == "maintenance", node
        assert "lifted" not in healthy.log(NODE, healthy.container_log_offset(NODE))
    finally:
        controller.check_output(f"scontrol update nodename={NODE} state=resume")


def test_the_new_pod_lifts_a_pod_drain_its_predecessor_left(healthy: LocalCluster):
    """A pod killed before it could hand its drain over (SIGKILL, the controller away) leaves
    the node drained `slonk:pod:`; the new pod lifts it once its slurmd registered."""
    healthy.slonk("stop", NODE)
    healthy.pod(CONTROLLER).check_output(
        f"scontrol update nodename={NODE} state=drain reason='{POD_DRAIN}killed'"
    )
    assert healthy.node_states()[NODE].drained
    before = healthy.slurmd_started(NODE)
    offset = healthy.log_offset(NODE)
    healthy.slonk("restart", NODE)
    _back_idle(healthy, before)
    # Said once the resume returned, which Slurm may show first.
    wait_for(
        "the new pod's word",
        lambda: "lifted the drain of the pod before" in healthy.log(NODE, offset),
    )
