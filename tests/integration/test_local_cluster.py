"""`slonk local`: the chart's pods as real Slurm daemons, and what happens when things break."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from slonk.base import paths
from slonk.local.projection import project, read

from ..support.cluster import LocalCluster, service_pid, slonk, wait_for

WORKERS = {"slonk-cpu-0", "slonk-cpu-1"}
# The pods with a config-watch: the login pod has nothing of its own to follow (configless).
PODS = ("slonk-controller-0", "slonk-cpu-0")


def test_up_brings_every_node_to_idle(cluster: LocalCluster):
    assert {n: s for n, (s, _) in cluster.nodes().items()} == dict.fromkeys(WORKERS, "idle")
    status = cluster.slonk("status").stdout
    for pod in ("slonk-controller-0", "slonk-login-0", *WORKERS):
        assert re.search(rf"^{pod} .* Running .*s6-svscan", status, re.MULTILINE), status


def test_pods_run_their_daemons_under_s6_as_pid_1(cluster: LocalCluster):
    for pod, daemon in [
        ("slonk-controller-0", "slurmctld"),
        ("slonk-cpu-0", "slurmd"),
        ("slonk-login-0", "sshd"),
    ]:
        host = cluster.pod(pod)
        assert host.check_output("cat /proc/1/comm") == "s6-svscan"
        for service in (daemon, "munged"):
            pid = service_pid(host, service)
            assert pid and host.check_output(f"cat /proc/{pid}/status").startswith(
                f"Name:\t{service}"
            ), f"{service} not running in {pod}"
        assert host.check_output("hostname") == pod


def test_a_user_submits_jobs_through_the_login_pod(healthy: LocalCluster):
    user = healthy.user("demo")
    assert user.check_output("id -un") == "demo"
    assert user.check_output("hostname") == "slonk-login-0"
    job = healthy.submit("--output=/dev/null", "--wrap", "hostname > $HOME/where-$SLURM_JOB_ID")
    wait_for(f"job {job} to finish", lambda: job not in healthy.jobs())
    # Written on a worker, read on the login pod: /home is one shared volume.
    ran_on = user.file(f"/home/demo/where-{job}")
    assert ran_on.user == "demo"
    assert ran_on.content_string.strip() in WORKERS
    hosts = user.check_output("srun --nodes=2 hostname </dev/null").split()
    assert set(hosts) == WORKERS


def test_nodes_and_pods_agree_on_users(healthy: LocalCluster):
    ids = healthy.user("demo").check_output("srun --nodes=2 id </dev/null").splitlines()
    assert ids == ["uid=5000(demo) gid=5000(demo) groups=5000(demo),5100(research)"] * 2


def test_mpi_steps_get_pmix(healthy: LocalCluster):
    user = healthy.user("demo")
    assert "pmix" in user.check_output("srun --mpi=list </dev/null 2>&1")
    ranks = user.check_output("srun --nodes=2 --mpi=pmix printenv PMIX_RANK </dev/null")
    assert sorted(ranks.split()) == ["0", "1"]
    assert "can not load PMIx" not in healthy.log("slonk-controller-0")


def test_root_and_passwords_cannot_log_in(healthy: LocalCluster):
    config = healthy.pod("slonk-login-0").check_output("/usr/sbin/sshd -T")
    assert "permitrootlogin no" in config
    assert "passwordauthentication no" in config
    assert healthy.user("root").run("true").rc != 0


JOB_STATE = paths.STATE_SAVE / "job_state"


def _wait_jobs_saved(cluster: LocalCluster) -> None:
    """slurmctld saves its job state a few seconds after a change (its save thread waits up
    to 5 s between saves). Killed before that, it comes back believing an ended job still
    runs, and holds its CPUs for minutes (Slurm's own behaviour after a crash, which this
    test is not about). Waits for a save after the newest job's end: one stamped a later
    second than that end (Slurm gives ends in whole seconds, and a file's time never runs
    ahead), else the one a held job, submitted and cancelled here, makes slurmctld write."""
    controller = cluster.pod("slonk-controller-0")

    def saved() -> tuple[str, int]:
        """(which save: inode and time, its whole second); ("", 0) before the first."""
        out = controller.run(f"stat -c '%i %y|%Y' {JOB_STATE}")
        if out.rc != 0:
            return "", 0
        save, second = out.stdout.strip().split("|")
        return save, int(second)

    jobs = json.loads(controller.check_output("scontrol show job --json"))["jobs"]
    newest = max((job["end_time"]["number"] for job in jobs), default=0)
    save, second = saved()
    if second > newest:
        return
    # Saved in the second the newest job ended, perhaps before it: any save from now on
    # holds every end, and a job's coming and going makes one.
    prompt = cluster.submit("--hold", "--output=/dev/null", "--wrap", "true")
    controller.check_output(f"scancel {prompt}")
    wait_for("slurmctld to save its job state", lambda: saved()[0] not in ("", save))


@pytest.mark.parametrize(
    ("pod", "daemon"),
    [("slonk-cpu-0", "slurmd"), ("slonk-controller-0", "slurmctld"), ("slonk-login-0", "sshd")],
)
def test_s6_restarts_a_killed_daemon(healthy: LocalCluster, pod: str, daemon: str):
    host = healthy.pod(pod)
    if daemon == "slurmctld":
        _wait_jobs_saved(healthy)
    before = service_pid(host, daemon)
    host.check_output(f"kill -9 {before}")
    wait_for(f"{daemon} back in {pod}", lambda: service_pid(host, daemon) not in (0, before))
    healthy.wait_idle()
    user = healthy.user("demo")
    wait_for("a login", lambda: user.run("true").rc == 0)  # sshd has its pid before it listens
    assert user.check_output("srun --nodes=2 true </dev/null; echo ok") == "ok"


def test_a_restarted_controller_keeps_its_queue(healthy: LocalCluster):
    running = healthy.submit("--nodes=2", "--exclusive", "--wrap", "sleep 300")
    wait_for(f"job {running} running", lambda: healthy.jobs().get(running) == "RUNNING")
    pending = healthy.submit("--nodes=1", "--wrap", "sleep 1")
    wait_for(f"job {pending} pending", lambda: healthy.jobs().get(pending) == "PENDING")
    healthy.slonk("restart", "slonk-controller-0")
    wait_for("the controller answering", healthy.jobs)
    assert healthy.jobs() == {running: "RUNNING", pending: "PENDING"}


def test_a_stopping_worker_gets_no_new_jobs(healthy: LocalCluster):
    job = healthy.submit("--nodelist=slonk-cpu-1", "--wrap", "sleep 300")
    wait_for(f"job {job} running", lambda: healthy.jobs().get(job) == "RUNNING")
    offset = healthy.log_offset("slonk-cpu-1")
    healthy.slonk("stop", "slonk-cpu-1")
    state, reason = healthy.nodes()["slonk-cpu-1"]
    stopping = healthy.log("slonk-cpu-1", offset)  # what the pod said of its stop, if this fails
    assert state.split("+")[0] == "down", stopping  # not responding, too, once slurmd is gone
    assert reason == "slonk:pod: stopping", stopping
    # Batch jobs on a failed node are requeued (Slurm's default JobRequeue=1).
    wait_for(f"job {job} requeued", lambda: healthy.jobs().get(job) == "PENDING")
    other = healthy.submit("--output=/dev/null", "--wrap", "hostname > $HOME/other-$SLURM_JOB_ID")
    wait_for(f"job {other} to finish", lambda: other not in healthy.jobs())
    ran_on = healthy.user().file(f"/home/demo/other-{other}").content_string.strip()
    assert ran_on == "slonk-cpu-0"
    healthy.pod("slonk-controller-0").check_output(f"scancel {job}")
    healthy.slonk("restart", "slonk-cpu-1")
    healthy.wait_idle()


def _pools(spec: dict) -> None:
    spec["partitions"]["main"]["pools"] = ["gpu"]


def _max_time(spec: dict) -> None:
    spec["partitions"]["main"]["maxTime"] = "INFINITE\nNodeName=evil CPUs=1"


def _alias(spec: dict) -> None:
    spec["slurmConf"] = {"controlmachine": "evil"}


def _option(spec: dict) -> None:
    spec["extraLines"] = ["MaxJobCount=5 NodeName=evil"]


# A hand-edited ConfigMap (or one from an older chart) reaches the pods without the chart's
# checks: each pod's parser must refuse it on its own.
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_pools, "partitions.main.pools[0]: unknown nodepool 'gpu'"),
        (_max_time, "partitions.main.maxTime: 'INFINITE\\nNodeName=evil CPUs=1' holds a control"),
        (_alias, "slurmConf.controlmachine: set by slonk from the spec"),
        (_option, "extraLines[0]: 'MaxJobCount=5 NodeName=evil' is not one 'Key=Value'"),
    ],
    ids=["unknown-pool", "newline", "alias", "second-option"],
)
def test_a_broken_configmap_is_refused_and_jobs_keep_running(
    healthy: LocalCluster, change: Callable[[dict], None], reason: str
):
    configmap = healthy.state_dir / "configmaps" / "slonk-cluster"
    good = read(configmap)
    controller = healthy.pod("slonk-controller-0")
    conf_before = controller.file("/etc/slurm/slurmctld/slurm.conf").content_string
    job = healthy.submit("--wrap", "sleep 300")
    wait_for(f"job {job} running", lambda: healthy.jobs().get(job) == "RUNNING")
    spec = yaml.safe_load(good["cluster.yaml"])
    change(spec)
    offsets = {pod: healthy.log_offset(pod) for pod in PODS}
    try:
        project(configmap, {"cluster.yaml": yaml.safe_dump(spec).encode()})
        message = (
            "refused cluster.yaml change, running configuration kept: "
            f"/etc/slonk/cluster.yaml: {reason}"
        )
        for pod in PODS:
            wait_for(
                f"{pod} to refuse the change", lambda p=pod: message in healthy.log(p, offsets[p])
            )
        assert controller.file("/etc/slurm/slurmctld/slurm.conf").content_string == conf_before
        assert "evil" not in conf_before
        assert healthy.jobs() == {job: "RUNNING"}
        assert healthy.user().check_output("srun --nodes=2 true </dev/null; echo ok") == "ok"
    finally:
        project(configmap, good)


def test_a_valid_change_is_applied_everywhere(healthy: LocalCluster, tmp_path: Path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"partitions": {"short": {"pools": ["cpu"], "maxTime": 10}}}))

    def partitions() -> list[str]:
        return healthy.user().check_output("sinfo --noheader --format=%P").split()

    healthy.slonk("upgrade", "-f", str(values))
    try:
        wait_for("partition short", lambda: "short" in partitions())
        # Configless: the worker runs what slurmctld sends it (slurmd's cache).
        worker = healthy.pod("slonk-cpu-1").file("/run/slurm/conf/slurm.conf")
        wait_for(
            "the worker's slurmd to get it",
            lambda: "PartitionName=short" in (worker.content_string),
        )
        worker_conf = worker.content_string
        assert "Prolog=/run/slonk/bin/prolog" in worker_conf  # up's values are kept
    finally:
        # Upgrades compose (--reuse-values): going back is an upgrade removing it.
        values.write_text(yaml.safe_dump({"partitions": {"short": None}}))
        healthy.slonk("upgrade", "-f", str(values))
    wait_for("partition short gone", lambda: "short" not in partitions())


def _leftovers(state_dir: Path, prefix: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(state_dir) in cmdline:
                found.append(f"process {proc.name}: {cmdline}")
    found += [
        f"mount {line}"
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if str(state_dir) in line or prefix in line
    ]
    found += [f"netns {p.name}" for p in Path("/run/netns").glob(f"{prefix}-*")]
    return found


def test_a_second_cluster_runs_beside_and_leaves_nothing(cluster: LocalCluster, tmp_path: Path):
    """Two state dirs, two clusters: different names everywhere; `down` stops only its own."""
    from slonk.local.network import Network

    state_dir = tmp_path / "second"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "nodepools": {"cpu": {"replicas": 1, "cpus": 2, "memoryMiB": 512}},
                "login": {"replicas": 0},
            }
        )
    )
    second = LocalCluster(state_dir)
    prefix = Network.for_state_dir(state_dir).prefix
    try:
        second.slonk("up", "-f", str(values))
        assert {n: s for n, (s, _) in second.nodes().items()} == {"slonk-cpu-0": "idle"}
        assert cluster.nodes().keys() == WORKERS
    finally:
        second.slonk("down")
    assert _leftovers(state_dir, prefix) == []
    # The first cluster did not notice.
    cluster.wait_idle()
    assert cluster.user().check_output("srun --nodes=2 true </dev/null; echo ok") == "ok"
    # down is idempotent.
    second.slonk("down")


def test_down_after_a_partial_up(tmp_path: Path):
    """An `up` that fails half-way (a pod that cannot start) still comes down clean."""
    from slonk.local.network import Network

    state_dir = tmp_path / "broken"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "nodepools": {"cpu": {"replicas": 1, "cpus": 1, "memoryMiB": 256}},
                "login": {"replicas": 0},
                "munge": {"existingSecret": "not-there"},
            }
        )
    )
    try:
        result = slonk("local", "up", "-f", str(values), "--state-dir", str(state_dir), check=False)
        assert result.returncode == 1
        assert "no munge key" in result.stderr
    finally:
        slonk("local", "down", "--state-dir", str(state_dir))
    assert _leftovers(state_dir, Network.for_state_dir(state_dir).prefix) == []


def test_up_refuses_hostile_values_before_making_anything(tmp_path: Path):
    """A value that would add a slurm.conf line stops `up` at the chart, naming the key."""
    from slonk.local.network import Network

    state_dir = tmp_path / "hostile"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "partitions": {
                    "main": {"pools": ["cpu"], "maxTime": "INFINITE\nNodeName=evil CPUs=1"}
                }
            }
        )
    )
    try:
        result = slonk("local", "up", "-f", str(values), "--state-dir", str(state_dir), check=False)
        assert result.returncode == 1
        assert "at '/partitions/main/maxTime'" in result.stderr
        assert "Traceback" not in result.stderr
        assert _leftovers(state_dir, Network.for_state_dir(state_dir).prefix) == []
        assert not (state_dir / "cluster.json").exists()
    finally:  # an `up` that went through must not outlive the test
        slonk("local", "down", "--purge", "--state-dir", str(state_dir), check=False)
