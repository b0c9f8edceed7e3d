"""Lending a node to Kubernetes as Slurm power saving (slonk.slurm.power), on real Slurm: the node
shows powered down, never DOWN; a job that needs it pends saying why and is not killed; given
back, the node is idle and the job runs. With returnOnDemand, the job itself asks the node
back through ResumeProgram.

A cluster of its own (controller and two workers, no login pod: jobs are submitted as root
in the controller pod). The syncer's part (which ordinal is lent, starting the pod again) is
played by the test: `slonk local stop` and `restart`; slonk.slurm.power runs in the controller pod,
where the syncer calls it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest

from slonk.base import paths
from slonk.slurm import slurm_state
from slonk.slurm.slurm_state import NodeState

from ..support.cluster import LocalCluster, cluster_of_its_own, wait_for

CONTROLLER = "slonk-controller-0"
LENT = "slonk-cpu-1"
VALUES = {
    # slonk.slurm.power driven by hand, in the syncer's place: no syncer to race it.
    "syncer": {"enabled": False},
    "nodepools": {"cpu": {"cpus": 2, "memoryMiB": 512, "replicas": 2}},
    "login": {"replicas": 0},
    "ldap": {"dev": {"enabled": False}},
}
NEEDS_LENT = (
    "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"
)


class Power(LocalCluster):
    def run(self, command: str, pod: str = CONTROLLER) -> str:
        return self.pod(pod).check_output(command)

    def power(self, call: str) -> str:
        """slonk.slurm.power's `call`, in the controller pod (the syncer's place): what it
        returns."""
        code = f"from slonk.slurm import power; print(repr(power.{call}))"
        return self.run(f"/opt/slonk/bin/python3 -c {shlex.quote(code)}")

    def node(self, name: str = LENT) -> NodeState:
        return wait_for(f"{name}'s state", lambda: self.node_states().get(name))

    def sinfo_state(self, name: str = LENT) -> str:
        return self.run(f"sinfo --noheader --Node --nodes={name} --format=%T").strip()

    def sbatch(self, *sbatch_args: str) -> str:
        return self.run(
            f"sbatch --parsable --output=/dev/null {shlex.join(sbatch_args)} --wrap true"
        ).strip()

    def job(self, job: str) -> slurm_state.Job | None:
        out = self.pod(CONTROLLER).run(f"scontrol show job {shlex.quote(job)} --json")
        found = (
            [j for j in slurm_state.parse_jobs(out.stdout) if j.id == job] if out.rc == 0 else []
        )
        return found[0] if found else None

    def reason(self, job: str) -> str:
        return self.run(f"squeue --noheader --jobs={job} --format=%R").strip()

    def lend(self, on_demand: bool) -> NodeState:
        """LENT drained while its pod runs, the pod stopped, the node powered down."""
        assert self.power(f"lend({LENT!r}, 'scaled to 1', pod_gone=False)") == "False"
        assert self.node().reason == "slonk:k8s:lent: scaled to 1"
        self.slonk("stop", LENT)
        call = f"lend({LENT!r}, 'scaled to 1', pod_gone=True, on_demand={on_demand})"
        wait_for(f"{LENT} lent", lambda: self.power(call) == "True")
        return self.node()

    def give_back(self, started: str) -> None:
        """The syncer's part: LENT's pod runs again; once its new slurmd registered, give_back."""
        wait_for(f"a new slurmd on {LENT}", lambda: self.node().slurmd_started != started)
        wait_for(f"{LENT} given back", lambda: self.power(f"give_back({LENT!r})") == "True")

    def wait_completed(self, job: str) -> slurm_state.Job:
        seen: list[slurm_state.Job | None] = [None]

        def completed() -> bool:
            seen[0] = self.job(job)
            return seen[0] is not None and seen[0].state == "COMPLETED"

        try:
            wait_for(f"job {job} completed", completed)
        except AssertionError as err:
            raise AssertionError(f"{err}; last seen: {seen[0]}; nodes: {self.nodes()}") from None
        assert seen[0] is not None
        return seen[0]


small = cluster_of_its_own("power", VALUES, Power)


@pytest.fixture
def power(small: Power) -> Iterator[Power]:
    """The cluster with both nodes up and idle; after the test, LENT's pod runs and nothing
    of the test is left in Slurm."""
    small.wait_idle()
    yield small
    small.slonk("restart", LENT)
    small.pod(CONTROLLER).run("scancel --user=root")
    wait_for(f"{LENT} back", lambda: small.power(f"give_back({LENT!r})") == "True")
    small.wait_idle()


def test_lent_node_shows_powered_down_and_its_job_waits(power: Power):
    started = power.node().slurmd_started
    node = power.lend(on_demand=False)
    assert node.powered_down and node.drained and node.state == "idle", node.label
    assert node.reason == "slonk:k8s:lent: scaled to 1"
    assert power.sinfo_state() == "drained~"  # powered down, not down*
    job = power.sbatch("--nodes=2")
    wait_for(f"job {job}'s reason", lambda: power.reason(job) == f"({NEEDS_LENT})")
    found = power.job(job)
    assert found is not None and found.state == "PENDING"
    # A reconfigure (what config-watch runs) keeps the node lent.
    power.run("scontrol reconfigure")
    wait_for(f"{LENT} lent after reconfigure", lambda: power.sinfo_state() == "drained~")
    assert power.job(job).state == "PENDING"
    power.slonk("restart", LENT)
    power.give_back(started)
    done = power.wait_completed(job)
    assert done.restarts == 0


def test_on_demand_a_job_asks_the_node_back(power: Power):
    started = power.node().slurmd_started
    node = power.lend(on_demand=True)
    assert node.powered_down and not node.drained, node.label
    assert power.sinfo_state() == "idle~"
    job = power.sbatch("--nodes=2")
    # The scheduler gives the job the powered-down node; slurmctld's ResumeProgram (as
    # SlurmUser) records it for the syncer.
    wait_for(f"{LENT} asked back", lambda: LENT in power.power("read_requests()"))
    requests = json.loads(power.run(f"cat {paths.POWER_REQUESTS}"))
    assert requests["version"] == 1 and LENT in requests["nodes"], requests
    assert power.node().powering_up
    found = power.job(job)
    assert found is not None and found.state in ("PENDING", "CONFIGURING", "RUNNING")
    # The syncer's part: start the pod; its slurmd says it just booted (-b), so Slurm takes it.
    power.slonk("restart", LENT)
    power.give_back(started)
    done = power.wait_completed(job)
    assert done.restarts == 0
    power.power(f"forget_requests([{LENT!r}])")
    assert LENT not in power.power("read_requests()")


def test_a_pod_gone_undrained_is_lent_not_down(power: Power):
    """Its pod stopped without a drain first (its SIGTERM set the node DOWN): lent all the
    same, powered down and drained, not `down~`."""
    started = power.node().slurmd_started
    power.slonk("stop", LENT)
    wait_for(f"{LENT} down", lambda: power.node().state == "down")
    call = f"lend({LENT!r}, 'scaled to 1', pod_gone=True)"
    wait_for(f"{LENT} lent", lambda: power.power(call) == "True")
    assert power.sinfo_state() == "drained~"
    assert power.node().reason == "slonk:k8s:lent: scaled to 1"
    power.slonk("restart", LENT)
    power.give_back(started)
    power.wait_idle()


def test_a_persons_drain_comes_back_with_its_reason(power: Power):
    """A person drained the node before it was lent. With accounting storage (on by default)
    Slurm forgets a drained node's reason as it powers up: slonk puts the person's back, and
    leaves their drain."""
    started = power.node().slurmd_started
    power.run(f"scontrol update nodename={LENT} state=drain reason='bad fan'")
    try:
        power.slonk("stop", LENT)
        call = f"lend({LENT!r}, 'scaled to 1', pod_gone=True)"
        wait_for(f"{LENT} lent", lambda: power.power(call) == "True")
        assert (power.sinfo_state(), power.node().reason) == ("drained~", "bad fan")
        power.slonk("restart", LENT)
        power.give_back(started)
        node = power.node()
        assert node.up and node.drained and node.reason == "bad fan", node.label
    finally:
        power.run(f"scontrol update nodename={LENT} state=resume")
