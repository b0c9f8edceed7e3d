"""Prolog and epilog from git on a local cluster: push once, every node runs it; a broken
push is refused; a failing prolog drains its node and the job goes elsewhere."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import LocalCluster, wait_for

WORKERS = ("slonk-cpu-0", "slonk-cpu-1")


def _status(cluster: LocalCluster, worker: str) -> str:
    return cluster.pod(worker).check_output("slonk hooks status")


def _active_everywhere(cluster: LocalCluster, commit: str) -> None:
    wait_for(f"revision {commit[:12]} active on every worker", lambda: all(
        f"active:  {commit}" in _status(cluster, w) for w in WORKERS), timeout=15)


def _hook_log(cluster: LocalCluster, worker: str, job: str) -> str:
    result = cluster.pod(worker).run(f"cat /var/log/slonk/hooks/{job}.log")
    return result.stdout if result.rc == 0 else ""


def _run_on_both(cluster: LocalCluster) -> str:
    job = cluster.submit("--nodes=2", "--output=/dev/null", "--wrap", "srun true")
    wait_for(f"job {job} to finish", lambda: job not in cluster.jobs())
    return job


@pytest.fixture
def hooks(healthy: LocalCluster) -> Iterator[LocalCluster]:
    """Leaves the repository with no hooks and every node slonk drained back in service."""
    yield healthy
    repo = healthy.hooks
    commit = repo.push({name: None for name in repo.git("ls-files").split() if "/" in name})
    _active_everywhere(healthy, commit)
    for node, (_, reason) in healthy.nodes().items():
        if reason.startswith("slonk:prolog:"):
            healthy.pod("slonk-controller-0").check_output(
                f"scontrol update nodename={node} state=resume")


def test_a_pushed_prolog_runs_on_every_worker(hooks: LocalCluster):
    commit = hooks.hooks.push({"prolog.d/10-mark": "#!/bin/sh\necho marked $(hostname)\n"})
    _active_everywhere(hooks, commit)
    job = _run_on_both(hooks)
    for worker in WORKERS:
        assert f"marked {worker}" in _hook_log(hooks, worker, job)


def test_a_broken_push_is_refused_and_the_last_good_prolog_keeps_running(hooks: LocalCluster):
    good = hooks.hooks.push({"prolog.d/10-mark": "#!/bin/sh\necho still good\n"})
    _active_everywhere(hooks, good)
    bad = hooks.hooks.push({"prolog.d/20-typo": "#!/bin/bash\nif [ -f x ]; then echo\n"})
    wait_for("the refusal on every worker", lambda: all(
        f"refused: {bad}" in _status(hooks, w) for w in WORKERS), timeout=15)
    status = _status(hooks, "slonk-cpu-0")
    assert f"active:  {good}" in status
    assert "prolog.d/20-typo: line 3: syntax error" in status
    job = _run_on_both(hooks)
    assert "still good" in _hook_log(hooks, "slonk-cpu-1", job)
    assert all(state == "idle" for state, _ in hooks.nodes().values())


def test_a_failing_prolog_drains_its_node_and_the_job_is_requeued(hooks: LocalCluster):
    failing = hooks.hooks.push({"prolog.d/10-gpu-check": "#!/bin/sh\necho no GPU >&2\nexit 1\n"})
    _active_everywhere(hooks, failing)
    job = hooks.submit("--nodelist=slonk-cpu-0", "--output=/dev/null", "--wrap", "true")
    wait_for("slonk-cpu-0 drained", lambda: hooks.nodes()["slonk-cpu-0"][0] == "drained")
    assert hooks.nodes()["slonk-cpu-0"][1] == "slonk:prolog:10-gpu-check: exit 1"
    assert "no GPU" in _hook_log(hooks, "slonk-cpu-0", job)
    # Requeued, not held (nohold_on_prolog_fail): Slurm starts it again after its requeue delay.
    wait_for(f"job {job} requeued", lambda: hooks.jobs().get(job) == "PENDING")
    # The operator pushes a fix and resumes the node: jobs run on it again.
    fixed = hooks.hooks.push({"prolog.d/10-gpu-check": "#!/bin/sh\necho GPU fine\n"})
    _active_everywhere(hooks, fixed)
    controller = hooks.pod("slonk-controller-0")
    controller.check_output("scontrol update nodename=slonk-cpu-0 state=resume")
    after = hooks.submit("--nodelist=slonk-cpu-0", "--output=/dev/null", "--wrap", "true")
    wait_for(f"job {after} to finish", lambda: after not in hooks.jobs())
    assert "GPU fine" in _hook_log(hooks, "slonk-cpu-0", after)


def test_the_epilog_sees_the_jobs_environment(hooks: LocalCluster):
    commit = hooks.hooks.push({
        "epilog.d/10-env": "#!/bin/sh\necho epilog job=$SLURM_JOB_ID user=$SLURM_JOB_USER\n"})
    _active_everywhere(hooks, commit)
    job = _run_on_both(hooks)
    wait_for("the epilog's output", lambda: f"epilog job={job} user=demo" in _hook_log(
        hooks, "slonk-cpu-0", job))
