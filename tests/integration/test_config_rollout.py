"""Configuration rollout on a real local cluster: a Slurm-rejected change leaves every node
running the old configuration, with one clear log line, and jobs keep running throughout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slonk.config.render import render
from slonk.config.spec import parse_spec
from slonk.local.projection import project, read

from ..support.cluster import LocalCluster, service_pid, wait_for

CONTROLLER = "slonk-controller-0"
WORKERS = ("slonk-cpu-0", "slonk-cpu-1")
CACHE = "/run/slurm/conf/slurm.conf"  # what slurmd runs: slurmctld sent it
REFUSED = "refused cluster.yaml change, every node keeps the running configuration"
APPLIED = "applied cluster.yaml change"
POOL = {"cpus": 4, "memoryMiB": 1024}  # slonk local's pool cpu (local/values.yaml)
WITH_SHORT = {"partitions": {"short": {"pools": ["cpu"], "maxTime": 10}}}


def _upgrade(cluster: LocalCluster, path: Path, values: dict, check: bool = True) -> str:
    path.write_text(yaml.safe_dump(values))
    result = cluster.slonk("upgrade", "-f", str(path), check=check)
    return result.stdout + result.stderr


def _said(cluster: LocalCluster, offset: int, text: str) -> list[str]:
    """The controller's log lines past byte offset `offset` that contain `text`."""
    return [line for line in cluster.log(CONTROLLER, offset).splitlines() if text in line]


def _pids(cluster: LocalCluster, service: str, pods: tuple[str, ...]) -> dict[str, str]:
    """The pid of each pod's s6 service: a new one means the daemon was restarted."""
    return {pod: service_pid(cluster.pod(pod), service) for pod in pods}


def _back_to_ups_values(cluster: LocalCluster, tmp_path: Path) -> None:
    """Upgrades compose (like --reuse-values): the tests' changes are undone by naming up's
    pool again and removing the partition they add."""
    _upgrade(
        cluster,
        tmp_path / "back.yaml",
        {"nodepools": {"cpu": {**POOL, "replicas": 2}}, "partitions": {"short": None}},
    )
    spec = parse_spec(
        yaml.safe_load(read(cluster.state_dir / "configmaps" / "slonk-cluster")["cluster.yaml"])
    )
    live = cluster.pod(CONTROLLER).file("/etc/slurm/slurmctld/slurm.conf")
    wait_for(
        "the controller on up's values", lambda: live.content_string == render(spec)["slurm.conf"]
    )


def _partitions(cluster: LocalCluster, host) -> list[str]:
    return host.check_output("sinfo --noheader --format=%P").split()


@pytest.fixture
def held_job(healthy: LocalCluster) -> Iterator[str]:
    """A job that runs until the test lets it finish (it checks it finished, then)."""
    job = healthy.submit(
        "--output=/dev/null",
        "--wrap",
        "until [ -e $HOME/release-$SLURM_JOB_ID ]; do sleep 0.2; done; "
        "echo done > $HOME/finished-$SLURM_JOB_ID",
    )
    wait_for(f"job {job} running", lambda: healthy.jobs().get(job) == "RUNNING")
    yield job
    healthy.user().run(f"touch release-{job}")


def _finishes(cluster: LocalCluster, job: str) -> None:
    assert cluster.jobs().get(job) == "RUNNING"
    cluster.user().check_output(f"touch release-{job}")
    wait_for(f"job {job} to finish", lambda: job not in cluster.jobs())
    assert cluster.user().check_output(f"cat finished-{job}") == "done"


# A plugin slurmctld does not have kills the re-executed slurmctld (it says so once); a key
# scontrol cannot parse never reaches slurmctld (scontrol reads the files first).
@pytest.mark.parametrize(
    ("setting", "slurm_said", "slurmctld_said"),
    [
        ({"SelectType": "select/bogus"}, "fatal: Can't find plugin for select/bogus", 1),
        ({"BogusKey": 1}, "error: _parse_next_key: Parsing error at unrecognized key: BogusKey", 0),
    ],
    ids=["unknown-plugin", "unknown-key"],
)
def test_a_setting_slurm_refuses_reaches_no_node(
    healthy: LocalCluster,
    held_job: str,
    tmp_path: Path,
    setting: dict,
    slurm_said: str,
    slurmctld_said: int,
):
    user, worker = healthy.user(), healthy.pod(WORKERS[0])
    slurmds = _pids(healthy, "slurmd", WORKERS)
    offset = healthy.log_offset(CONTROLLER)
    try:
        said = _upgrade(
            healthy, tmp_path / "refused.yaml", {"slurm": {"slurmConf": setting}}, check=False
        )
        assert f"slonk watch-config: {REFUSED}" in said  # `upgrade` reports it, and puts back
        wait_for("the controller to refuse it", lambda: _said(healthy, offset, REFUSED))
        assert _partitions(healthy, user) == ["main*"]  # the login pod's clients work
        assert _partitions(healthy, worker) == ["main*"]  # and a worker's
        # A later valid change is applied: a controller retrying the refused one would have
        # said so again by then, and slurmctld would have said why again.
        _upgrade(healthy, tmp_path / "valid.yaml", WITH_SHORT)
        wait_for("the later change", lambda: _said(healthy, offset, APPLIED))
        (line,) = _said(healthy, offset, REFUSED)
        assert f"slurmctld would not run it: {slurm_said}" in line, line
        assert len(_said(healthy, offset, f"slurmctld: {slurm_said}")) == slurmctld_said
        wait_for(
            "the new partition on the login pod",
            lambda: _partitions(healthy, user) == ["main*", "short"],
        )
        for pod in WORKERS:
            cache = healthy.pod(pod).file(CACHE)
            wait_for(
                f"{pod}'s slurmd to get it",
                lambda c=cache: "PartitionName=short" in (c.content_string),
            )
            assert "{}={}".format(*next(iter(setting.items()))) not in cache.content_string
        assert _pids(healthy, "slurmd", WORKERS) == slurmds  # no slurmd restarted
        _finishes(healthy, held_job)
    finally:
        _back_to_ups_values(healthy, tmp_path)


def test_a_new_node_changes_only_what_it_should(
    healthy: LocalCluster, held_job: str, tmp_path: Path
):
    """A node more in the pool: slurmctld re-executes on it (`scontrol reconfigure`: same
    pid) and every slurmd learns it, none restarts, and the login pod is untouched.
    (`slonk local upgrade` makes no new pod: in local mode the node's name does not resolve,
    so slurmctld leaves it out.)"""
    daemons = {**_pids(healthy, "slurmd", WORKERS), **_pids(healthy, "sshd", ("slonk-login-0",))}
    slurmctld = _pids(healthy, "slurmctld", (CONTROLLER,))
    offset = healthy.log_offset(CONTROLLER)
    try:
        _upgrade(healthy, tmp_path / "three.yaml", {"nodepools": {"cpu": {"replicas": 3}}})
        (line,) = wait_for("the change", lambda: _said(healthy, offset, APPLIED))
        assert "rewrote slurm.conf, topology.conf; slurmctld runs it" in line
        for pod in WORKERS:
            cache = healthy.pod(pod).file(CACHE)
            wait_for(
                f"{pod}'s slurmd to get it",
                lambda c=cache: "NodeName=slonk-cpu-[0-2] " in c.content_string,
            )
        assert _pids(healthy, "slurmctld", (CONTROLLER,)) == slurmctld  # not restarted
        assert {
            **_pids(healthy, "slurmd", WORKERS),
            **_pids(healthy, "sshd", ("slonk-login-0",)),
        } == daemons
        assert _partitions(healthy, healthy.user()) == ["main*"]
        _finishes(healthy, held_job)
    finally:
        _back_to_ups_values(healthy, tmp_path)


def test_a_controller_restarted_on_a_refused_configuration_runs_the_accepted_one(
    healthy: LocalCluster, held_job: str, tmp_path: Path
):
    """The refusal and the accepted files live on slurmctld's state volume: a controller pod
    started on a cluster.yaml slurmctld will not run takes the accepted files back, and one
    restarted on it again does not even try it. (A plugin no other test names: slurmctld
    refused select/bogus already, and a pod would start on the accepted files at once.)"""
    user = healthy.user()
    slurmds = _pids(healthy, "slurmd", WORKERS)
    configmap = healthy.state_dir / "configmaps" / "slonk-cluster"
    spec = yaml.safe_load(read(configmap)["cluster.yaml"])
    spec["slurmConf"]["SelectType"] = "select/nonesuch"
    healthy.slonk("stop", CONTROLLER)
    offset = healthy.log_offset(CONTROLLER)
    try:
        # What a `helm upgrade` does while the controller pod is away: the ConfigMap changes.
        project(configmap, {"cluster.yaml": yaml.safe_dump(spec).encode()})
        healthy.slonk("restart", CONTROLLER)
        (line,) = wait_for(
            "the controller to take it back",
            lambda: _said(healthy, offset, "it runs the last configuration it accepted"),
        )
        assert (
            "slurmctld refused cluster.yaml's configuration "
            "(fatal: Can't find plugin for select/nonesuch)" in line
        )
        assert _partitions(healthy, user) == ["main*"]
        offset = healthy.log_offset(CONTROLLER)
        healthy.slonk("restart", CONTROLLER)
        (line,) = wait_for(
            "the controller to start on the accepted files",
            lambda: _said(healthy, offset, "starting on the last configuration it accepted"),
        )
        assert (
            "slurmctld refused cluster.yaml's configuration before "
            "(fatal: Can't find plugin for select/nonesuch)" in line
        )
        wait_for("the controller answering", lambda: user.run("sinfo").rc == 0)
        assert _said(healthy, offset, "slurmctld: fatal") == []  # not tried again
        assert _pids(healthy, "slurmd", WORKERS) == slurmds
        _finishes(healthy, held_job)
    finally:
        _back_to_ups_values(healthy, tmp_path)
