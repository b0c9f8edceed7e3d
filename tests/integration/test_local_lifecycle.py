"""`slonk local upgrade`, `down` and `up` on a running cluster: no job is killed, no partition
is lost, nothing is half-applied.

A cluster of its own (controller and two workers, no login pod: jobs are submitted as root
in the controller pod), since `down` and `up` are part of what is tested. Each job waits for
a file on the shared /home, so the test decides when it ends.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slonk.local.cluster import Cluster, wait_nodes_up
from slonk.local.network import Network
from slonk.local.projection import read
from slonk.slurm import slurm_state

from ..support.cluster import LocalCluster, running, wait_for

CONTROLLER = "slonk-controller-0"
POOL = {"cpus": 2, "memoryMiB": 512}
VALUES = {
    "nodepools": {"cpu": {**POOL, "replicas": 2}},
    "login": {"replicas": 0},
    "ldap": {"dev": {"enabled": False}},
}


class Lifecycle(LocalCluster):
    def __init__(self, state_dir: Path, values: Path) -> None:
        super().__init__(state_dir)
        self.values = values

    def run(self, command: str, pod: str = CONTROLLER) -> str:
        return self.pod(pod).check_output(command)

    def upgrade(self, name: str, values: dict, check: bool = True):
        path = self.state_dir.parent / f"{name}.yaml"
        path.write_text(yaml.safe_dump(values))
        return self.slonk("upgrade", "-f", str(path), check=check)

    def hold(self, *sbatch_args: str) -> str:
        """A job that runs until release(job) is called."""
        wait = "until [ -e /home/release-$SLURM_JOB_ID ]; do sleep 0.1; done"
        return self.run(
            f"sbatch --parsable --output=/dev/null {shlex.join(sbatch_args)} "
            f"--wrap {shlex.quote(wait)}"
        ).strip()

    def release(self, job: str) -> None:
        self.run(f"touch /home/release-{job}")

    def job(self, job: str) -> dict[str, str]:
        """The job's state, restarts and batch host, in `scontrol show job`'s words ({} once
        Slurm forgot it)."""
        out = self.pod(CONTROLLER).run(f"scontrol show job {shlex.quote(job)} --json")
        jobs = slurm_state.parse_jobs(out.stdout) if out.rc == 0 else []
        found = [j for j in jobs if j.id == job]
        return {"JobState": found[0].state, "Restarts": str(found[0].restarts),
                "BatchHost": found[0].batch_host} if found else {}  # fmt: skip

    def wait_running(self, job: str) -> dict[str, str]:
        return wait_for(
            f"job {job} running", lambda: (f := self.job(job)).get("JobState") == "RUNNING" and f
        )

    def finish(self, job: str) -> None:
        self.release(job)
        seen: dict[str, str] = {}

        def completed() -> bool:
            seen.update(self.job(job))
            return seen.get("JobState") == "COMPLETED"

        try:
            wait_for(f"job {job} completed", completed)
        except AssertionError as err:
            shown = self.pod(CONTROLLER).run(f"scontrol show job {shlex.quote(job)}").stdout
            raise AssertionError(f"{err}; last seen: {seen}; Slurm shows:\n{shown}") from None

    def partitions(self) -> list[str]:
        return self.run("sinfo --noheader --format=%R").split()

    def record(self) -> dict:
        return json.loads((self.state_dir / "cluster.json").read_text())

    def spec_configmap(self) -> dict[str, bytes]:
        return read(self.state_dir / "configmaps" / "slonk-cluster")

    def steps_on(self, node: str) -> str:
        return self.run("ps -eo args", pod=node)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    state_dir = tmp_path_factory.mktemp("lifecycle") / "state"
    with running(state_dir, values=VALUES) as values:
        assert values is not None
        yield Lifecycle(state_dir, values)


@pytest.fixture
def lifecycle(small: Lifecycle) -> Iterator[Lifecycle]:
    """The small cluster with its nodes up; jobs a test left are cancelled after it."""
    small.wait_idle()
    yield small
    small.pod(CONTROLLER).run("scancel --user=root")


def test_upgrades_compose_like_reuse_values(lifecycle: Lifecycle):
    added = {"partitions": {"extra": {"pools": ["cpu"]}}}
    out = lifecycle.upgrade("first", added).stdout
    assert "slonk watch-config: applied cluster.yaml change" in out
    assert "extra" in lifecycle.partitions()  # the upgrade returned once the controller had it
    job = lifecycle.hold("--partition=extra")
    lifecycle.wait_running(job)

    lifecycle.upgrade("second", {"slurm": {"slurmConf": {"MessageTimeout": 20}}})
    assert re.search(r"MessageTimeout\s*= 20 sec", lifecycle.run("scontrol show config"))
    assert "extra" in lifecycle.partitions()
    assert lifecycle.job(job)["JobState"] == "RUNNING"
    lifecycle.finish(job)
    assert "extra" in lifecycle.partitions()

    # And back: null drops a partition and a setting, as with Helm.
    lifecycle.upgrade(
        "back", {"partitions": {"extra": None}, "slurm": {"slurmConf": {"MessageTimeout": None}}}
    )
    assert lifecycle.partitions() == ["main"]
    assert not re.search(r"MessageTimeout\s*= 20 sec", lifecycle.run("scontrol show config"))


def test_scale_up_starts_a_pod_and_keeps_jobs(lifecycle: Lifecycle):
    before = lifecycle.record()["pods"]
    job = lifecycle.hold("--nodelist=slonk-cpu-0")
    lifecycle.wait_running(job)

    lifecycle.upgrade("three", {"nodepools": {"cpu": {"replicas": 3}}})
    pods = lifecycle.record()["pods"]
    assert {n: p for n, p in pods.items() if n in before} == before  # no pod moved
    new = pods["slonk-cpu-2"]["address"]
    assert new not in {p["address"] for p in before.values()}
    lifecycle.wait_idle(("slonk-cpu-1", "slonk-cpu-2"))
    for pod in (CONTROLLER, "slonk-cpu-0"):  # cluster DNS answers for the new Service
        assert (
            lifecycle.run("getent hosts slonk-cpu-2.default.svc.cluster.local", pod).split()[0]
            == new
        )
    fields = lifecycle.job(job)
    assert (fields["JobState"], fields["Restarts"]) == ("RUNNING", "0")
    on_new = lifecycle.hold("--nodelist=slonk-cpu-2")
    lifecycle.wait_running(on_new)
    lifecycle.finish(on_new)
    lifecycle.finish(job)


def test_scale_down_refuses_a_busy_node_and_changes_nothing(lifecycle: Lifecycle):
    lifecycle.upgrade("three", {"nodepools": {"cpu": {"replicas": 3}}})
    lifecycle.wait_idle(("slonk-cpu-0", "slonk-cpu-1", "slonk-cpu-2"))
    job = lifecycle.hold("--nodelist=slonk-cpu-2")
    lifecycle.wait_running(job)
    configmap, record = lifecycle.spec_configmap(), lifecycle.record()
    values = (lifecycle.state_dir / "values.yaml").read_text()

    refused = lifecycle.upgrade("two", {"nodepools": {"cpu": {"replicas": 2}}}, check=False)
    assert refused.returncode == 1
    assert f"cannot remove slonk-cpu-2: slonk-cpu-2 runs job {job}" in refused.stderr
    assert lifecycle.spec_configmap() == configmap
    assert lifecycle.record() == record
    assert (lifecycle.state_dir / "values.yaml").read_text() == values
    assert lifecycle.nodes()["slonk-cpu-2"] == ("mixed", "")  # untouched (resumed: mixed*)
    assert lifecycle.job(job)["JobState"] == "RUNNING"

    lifecycle.finish(job)
    lifecycle.upgrade("two", {"nodepools": {"cpu": {"replicas": 2}}})
    assert set(lifecycle.nodes()) == {"slonk-cpu-0", "slonk-cpu-1"}
    assert "slonk-cpu-2" not in lifecycle.record()["pods"]
    netns = Network.for_state_dir(lifecycle.state_dir).pod_netns("slonk-cpu-2")
    assert not (Path("/run/netns") / netns).exists()


def test_a_value_slurm_refuses_is_reported_and_put_back(lifecycle: Lifecycle):
    job = lifecycle.hold()
    lifecycle.wait_running(job)
    configmap = lifecycle.spec_configmap()
    values = (lifecycle.state_dir / "values.yaml").read_text()

    bogus = {"slurm": {"slurmConf": {"SelectType": "select/bogus"}}}
    result = lifecycle.upgrade("bogus", bogus, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    reported = [line for line in result.stdout.splitlines() if "slonk watch-config:" in line]
    assert reported and any(w in reported[0] for w in ("refused", "could not")), result.stdout
    assert "put back" in result.stderr
    assert lifecycle.spec_configmap() == configmap
    assert (lifecycle.state_dir / "values.yaml").read_text() == values
    assert lifecycle.job(job)["JobState"] == "RUNNING"
    lifecycle.finish(job)
    lifecycle.finish(lifecycle.hold())  # the cluster still runs jobs


def test_down_with_jobs_running_then_up_leaves_no_ghost(lifecycle: Lifecycle):
    wide = lifecycle.hold("--nodes=2", "--exclusive")
    lifecycle.wait_running(wide)
    queued = lifecycle.hold("--nodes=2")
    wait_for(f"job {queued} pending", lambda: lifecycle.job(queued).get("JobState") == "PENDING")
    lifecycle.slonk("down")
    lifecycle.slonk("up", "-f", str(lifecycle.values))

    def truthful(job: str) -> dict[str, str] | None:
        """The job pending, or running where a slurmstepd runs it: never a ghost."""
        fields = lifecycle.job(job)
        if fields.get("JobState") == "RUNNING":
            return fields if f"[{job}.batch]" in lifecycle.steps_on(fields["BatchHost"]) else None
        return fields if fields.get("JobState") == "PENDING" else None

    for job in (wide, queued):
        wait_for(f"job {job} pending or really running", lambda j=job: truthful(j), timeout=30)
    assert lifecycle.job(wide)["Restarts"] == "1"  # requeued when its nodes stopped, not lost
    # Slurm 24.11 makes a requeued job eligible 2 minutes later (Reason=BeginTime); an
    # administrator may start it now, as here.
    lifecycle.pod(CONTROLLER).run(f"scontrol update jobid={wide} starttime=now")
    lifecycle.release(queued)
    lifecycle.finish(wide)
    wait_for(
        f"job {queued} completed", lambda: lifecycle.job(queued).get("JobState") == "COMPLETED"
    )


def test_a_node_running_a_job_counts_as_up(lifecycle: Lifecycle):
    """What `up` waits for: a requeued job may take a node the moment it registers."""
    job = lifecycle.hold("--nodelist=slonk-cpu-0")
    lifecycle.wait_running(job)
    assert lifecycle.nodes()["slonk-cpu-0"][0] == "mixed"
    wait_nodes_up(Cluster(lifecycle.state_dir), timeout=30, progress=lambda _: None)
    lifecycle.finish(job)


def test_a_job_asking_for_mail_without_a_relay_is_accepted_and_its_user_told(
    lifecycle: Lifecycle,
):
    # No mail.relay here (the chart's default): job_submit.lua answers at submission.
    submit = "sbatch --parsable --output=/dev/null --wrap true"
    asked = lifecycle.pod(CONTROLLER).run(f"{submit} --mail-type=END,FAIL")
    assert asked.rc == 0 and asked.stdout.strip().isdigit(), asked
    assert "this cluster sends no mail (no relay is set up)" in asked.stderr
    plain = lifecycle.pod(CONTROLLER).run(submit)
    assert plain.rc == 0 and "mail" not in plain.stderr, plain
