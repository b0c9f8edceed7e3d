"""Health checks on a local cluster, by fault injection into one worker: it is drained with
the check's reason and no job lands on it; healed, it returns. A person's drain outlives every
check and recycle; a node failing its boot checks is recycled, then quarantined."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from slonk.local.cluster import Cluster

from .conftest import HEALTH_INTERVAL, SCRATCH, LocalCluster, wait_for

BAD, GOOD = "slonk-cpu-1", "slonk-cpu-0"
# One interval, plus slurmd's jitter and the check's own time.
DRAIN_WITHIN = HEALTH_INTERVAL + 5


class Faults:
    """Breaks a worker the ways real nodes break, and undoes each afterwards."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.undo: list[tuple[str, str]] = []

    def inject(self, pod: str, command: str, undo: str) -> None:
        self.undo.append((pod, undo))
        self.cluster.pod(pod).check_output(command)

    def read_only_home(self, pod: str = BAD) -> None:
        self.inject(pod, "mount -o remount,bind,ro /home", "mount -o remount,bind,rw /home")

    def full_scratch(self, pod: str = BAD) -> None:
        # A small scratch filesystem in the pod, filled up.
        self.inject(pod, f"mount -t tmpfs -o size=4m scratch {SCRATCH} && "
                         f"fallocate -l 4m {SCRATCH}/fill", f"umount {SCRATCH}")

    def gpu(self, scenario: str, pod: str = BAD) -> None:
        # The fake nvidia-smi's state lives in the shared /home: it outlives pod restarts.
        self.inject(pod, f"mkdir -p /home/.fake-gpu && echo {scenario} > /home/.fake-gpu/{pod}",
                    f"rm -f /home/.fake-gpu/{pod}")

    def heal(self) -> None:
        while self.undo:
            pod, command = self.undo.pop()
            self.cluster.pod(pod).run(command)


@pytest.fixture
def faults(healthy: LocalCluster) -> Iterator[Faults]:
    injected = Faults(healthy)
    try:
        yield injected
    finally:
        injected.heal()
        healthy.slonk("upgrade")  # back to the values `up` had
        controller = healthy.pod("slonk-controller-0")
        for node, (_, reason) in healthy.nodes().items():
            if reason.startswith("slonk:quarantine") or reason == "maintenance":
                controller.run(f"scontrol update nodename={node} state=resume")


def _drained_with(cluster: LocalCluster, node: str, reason: str) -> float:
    """Seconds until `node` is drained (or draining) for `reason`."""
    started = time.monotonic()
    wait_for(f"{node} drained for {reason!r}", lambda: cluster.nodes()[node][1].startswith(
        reason) and "drain" in cluster.nodes()[node][0].split("+"), timeout=DRAIN_WITHIN)
    return time.monotonic() - started


def _hosts_of_new_jobs(cluster: LocalCluster, count: int) -> set[str]:
    jobs = [cluster.submit("--output=/dev/null", "--wrap", "hostname > $HOME/ran-$SLURM_JOB_ID")
            for _ in range(count)]
    wait_for("the jobs to finish", lambda: not set(jobs) & set(cluster.jobs()))
    user = cluster.user("demo")
    return {user.check_output(f"cat ran-{job}").strip() for job in jobs}


@pytest.mark.parametrize(("inject", "reason"), [
    pytest.param(Faults.read_only_home, "slonk:storage: /home is mounted read-only", id="home"),
    pytest.param(Faults.full_scratch, f"slonk:scratch: {SCRATCH} 0.0% free, below 5%",
                 id="scratch"),
    pytest.param(lambda f: f.gpu("ecc"),
                 "slonk:gpu: GPU 1 (00000000:2A:00.0): 2 uncorrectable ECC errors", id="gpu"),
])
def test_a_fault_drains_its_node_and_healing_returns_it(faults: Faults, inject, reason: str):
    inject(faults)
    _drained_with(faults.cluster, BAD, reason)
    assert _hosts_of_new_jobs(faults.cluster, 4) == {GOOD}
    faults.heal()
    faults.cluster.wait_idle()
    log = faults.cluster.pod(BAD).check_output("cat /var/log/slonk/health.log")
    assert f"resumed (was: {reason}" in log


def test_a_job_running_when_a_fault_appears_finishes(faults: Faults):
    cluster = faults.cluster
    job = cluster.submit(f"--nodelist={BAD}", "--output=/dev/null",
                         "--wrap", "sleep 6; echo done > $HOME/survived-$SLURM_JOB_ID")
    wait_for(f"job {job} running", lambda: cluster.jobs().get(job) == "RUNNING")
    faults.gpu("xid")
    _drained_with(cluster, BAD, "slonk:gpu: XID 79 on PCI:0000:2a:00")
    # no new jobs, this one keeps running
    assert cluster.nodes()[BAD][0] in ("mixed+drain", "allocated+drain")
    wait_for(f"job {job} to finish", lambda: job not in cluster.jobs())
    assert cluster.user("demo").check_output(f"cat survived-{job}").strip() == "done"


def _recycle_fast(cluster: LocalCluster) -> None:
    values = cluster.state_dir.parent / "recycle-fast.yaml"
    values.write_text("health: {recycle: {idleSeconds: 1, maxRecycles: 2, windowSeconds: 600}}\n")
    cluster.slonk("upgrade", "-f", str(values))


def test_a_persons_drain_survives_every_check_and_recycle(faults: Faults):
    cluster = faults.cluster
    controller = cluster.pod("slonk-controller-0")
    controller.check_output(f"scontrol update nodename={GOOD} state=drain reason=maintenance")
    _recycle_fast(cluster)
    pid = Cluster(cluster.state_dir).pid(GOOD)
    faults.gpu("ecc", pod=GOOD)
    time.sleep(3 * HEALTH_INTERVAL)
    assert cluster.nodes()[GOOD] == ("idle+drain", "maintenance")
    faults.heal()
    time.sleep(3 * HEALTH_INTERVAL)
    assert cluster.nodes()[GOOD] == ("idle+drain", "maintenance")
    assert Cluster(cluster.state_dir).pid(GOOD) == pid  # never recycled
    log = cluster.pod(GOOD).check_output("cat /var/log/slonk/health.log")
    assert "left idle+drain ('maintenance', set by 'root')" in log


def test_a_node_failing_boot_checks_registers_drained_then_is_recycled_then_quarantined(
    faults: Faults,
):
    cluster = faults.cluster
    faults.gpu("missing")
    offset = len(cluster.log(BAD))
    cluster.slonk("restart", BAD)
    # The old pod's interval check may drain the node first: wait for the new pod's boot.
    failed = "boot check failed: FAIL gpu        1 of 2 GPUs visible"
    wait_for(f"{BAD}'s boot checks to fail", lambda: failed in cluster.log(BAD)[offset:])
    reason = "slonk:gpu: 1 of 2 GPUs visible"
    wait_for(f"{BAD} registered drained", lambda: cluster.nodes()[BAD] == ("idle+drain", reason))
    _recycle_fast(cluster)
    quarantine = f"slonk:quarantine: recycled 2 times in 600 s; last {reason}"
    wait_for(f"{BAD} quarantined", lambda: cluster.nodes()[BAD] == ("idle+drain", quarantine),
             timeout=60)
    recycled = (cluster.state_dir / "apiserver" / "log").read_text().count(
        f"DELETE /api/v1/namespaces/default/pods/{BAD} HTTP/1.1\" 200")
    assert recycled == 2
    node = json.loads((cluster.state_dir / "apiserver" / "nodes" / "local.json").read_text())
    assert {"key": "slonk.io/quarantine", "value": BAD, "effect": "NoSchedule"} in node["spec"][
        "taints"]
    assert node["metadata"]["annotations"]["slonk.io/quarantine-reason"] == quarantine
    # Neither a healed GPU nor a new pod lifts a quarantine: that is the person's who
    # replaces the node (the fixture resumes it).
    faults.heal()
    cluster.slonk("restart", BAD)
    time.sleep(3 * HEALTH_INTERVAL)
    assert cluster.nodes()[BAD] == ("idle+drain", quarantine)
