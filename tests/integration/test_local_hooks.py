"""Prolog and epilog from git on a local cluster: push once, every node runs it; a broken
push, or one no job could run, is refused; a failing prolog drains its node as a hook's
fault, the job goes elsewhere, and the recycle loop leaves the machine alone."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest

from ..support.cluster import LocalCluster, wait_for

WORKERS = ("slonk-cpu-0", "slonk-cpu-1")


def _status(cluster: LocalCluster, worker: str) -> str:
    """`slonk hooks status` on the worker; "" while its pod is not running (one the recycle
    loop replaced activates the newest revision as it starts)."""
    result = cluster.pod(worker).run("slonk hooks status")
    return result.stdout if result.rc == 0 else ""


def _active_everywhere(cluster: LocalCluster, commit: str) -> None:
    wait_for(
        f"revision {commit[:12]} active on every worker",
        lambda: all(f"active:  {commit}" in _status(cluster, w) for w in WORKERS),
    )


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
    # -z: names as they are (a test pushes one with U+2028, which split() would cut)
    tracked = repo.git("ls-files", "-z").split("\0")
    commit = repo.push({name: None for name in tracked if "/" in name})
    _active_everywhere(healthy, commit)
    for node, (_, reason) in healthy.nodes().items():
        if reason.startswith("slonk:hook:"):
            healthy.pod("slonk-controller-0").check_output(
                f"scontrol update nodename={node} state=resume"
            )


def test_a_pushed_prolog_runs_on_every_worker(hooks: LocalCluster):
    commit = hooks.hooks.push({"prolog.d/10-mark": "#!/bin/sh\necho marked $(hostname)\n"})
    _active_everywhere(hooks, commit)
    job = _run_on_both(hooks)
    for worker in WORKERS:
        assert f"marked {worker}" in _hook_log(hooks, worker, job)
        # Hook logs hold jobs' environments: root's alone.
        modes = hooks.pod(worker).check_output(
            f"stat -c '%a %U' /var/log/slonk/hooks /var/log/slonk/hooks/{job}.log"
        )
        assert modes.splitlines() == ["700 root", "600 root"]


def test_a_broken_push_is_refused_and_the_last_good_prolog_keeps_running(hooks: LocalCluster):
    good = hooks.hooks.push({"prolog.d/10-mark": "#!/bin/sh\necho still good\n"})
    _active_everywhere(hooks, good)
    bad = hooks.hooks.push({"prolog.d/20-typo": "#!/bin/bash\nif [ -f x ]; then echo\n"})
    wait_for(
        "the refusal on every worker",
        lambda: all(f"refused: {bad}" in _status(hooks, w) for w in WORKERS),
    )
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
    wait_for("slonk-cpu-0 drained", lambda: hooks.nodes()["slonk-cpu-0"][0] == "idle+drain")
    assert hooks.nodes()["slonk-cpu-0"][1] == (
        f"slonk:hook:prolog:10-gpu-check: exit 1 (revision {failing[:12]})"
    )
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
    commit = hooks.hooks.push(
        {"epilog.d/10-env": "#!/bin/sh\necho epilog job=$SLURM_JOB_ID user=$SLURM_JOB_USER\n"}
    )
    _active_everywhere(hooks, commit)
    job = _run_on_both(hooks)
    wait_for(
        "the epilog's output",
        lambda: f"epilog job={job} user=demo" in _hook_log(hooks, "slonk-cpu-0", job),
    )


@pytest.mark.parametrize(
    ("name", "script", "problem"),
    [
        (
            "20-bad",
            "#!/bin/bash\r\necho hi\r\n",
            "#! line ends in a carriage return (CRLF line ends?)",
        ),
        (
            "20-bad",
            "#!/usr/bin/env no-such-interpreter\necho hi\n",
            "#! interpreter no-such-interpreter is not on the jobs' PATH",
        ),
        # The pod's /bin/sh is dash: bash syntax there fails on every node.
        ("20-bad", "#!/bin/sh\narr=(1 2 3)\n", '2: Syntax error: "(" unexpected'),
        # A name that would end a line in the drain reason (and crash-loop the recycler).
        ("20-x\u2028y", "#!/bin/sh\nexit 1\n", "name is not printable ASCII"),
    ],
)
def test_a_script_no_job_could_run_is_refused(
    hooks: LocalCluster, name: str, script: str, problem: str
):
    good = hooks.hooks.push({"prolog.d/10-mark": "#!/bin/sh\necho still good\n"})
    _active_everywhere(hooks, good)
    bad = hooks.hooks.push({f"prolog.d/{name}": script})
    wait_for(
        "the refusal on every worker",
        lambda: all(f"refused: {bad}" in _status(hooks, w) for w in WORKERS),
    )
    shown = name.encode("unicode_escape").decode()
    assert f"prolog.d/{shown}: {problem}" in _status(hooks, "slonk-cpu-0")
    job = _run_on_both(hooks)
    assert "still good" in _hook_log(hooks, "slonk-cpu-1", job)
    assert all(state == "idle" for state, _ in hooks.nodes().values())


def _deletes(cluster: LocalCluster, pod: str) -> int:
    log = (cluster.state_dir / "apiserver" / "log").read_text()
    return log.count(f'DELETE /api/v1/namespaces/default/pods/{pod} HTTP/1.1" 200')


@pytest.fixture
def recycling(hooks: LocalCluster) -> Iterator[LocalCluster]:
    """Recycling at once, and slonk-cpu-1's GPUs made faulty (the fake nvidia-smi's state
    is in /home); healed and back to the cluster's values afterwards."""
    values = hooks.state_dir.parent / "recycle-at-once.yaml"
    values.write_text("health: {recycle: {idleSeconds: 1, maxRecycles: 100}}\n")
    hooks.slonk("upgrade", "-f", str(values))
    try:
        yield hooks
    finally:
        hooks.pod("slonk-cpu-0").run("rm -f /home/.fake-gpu/slonk-cpu-1")
        hooks.wait_idle(("slonk-cpu-1",), timeout=180)  # a new pod, resumed by its checks
        hooks.recycle_as_the_session_does()


def test_a_node_a_hook_drained_is_not_recycled(recycling: LocalCluster):
    cluster = recycling
    failing = cluster.hooks.push({"prolog.d/10-broken": "#!/bin/sh\nexit 1\n"})
    _active_everywhere(cluster, failing)
    cluster.submit("--nodelist=slonk-cpu-0", "--output=/dev/null", "--wrap", "true")
    reason = f"slonk:hook:prolog:10-broken: exit 1 (revision {failing[:12]})"
    wait_for(
        "slonk-cpu-0 drained by the hook",
        lambda: cluster.nodes()["slonk-cpu-0"] == ("idle+drain", reason),
    )
    before, recycled = _deletes(cluster, "slonk-cpu-0"), _deletes(cluster, "slonk-cpu-1")
    # A machine fault on the other node: once the loop recycles it, it has passed over
    # slonk-cpu-0 (idle, drained by slonk) too.
    cluster.pod("slonk-cpu-1").check_output(
        "mkdir -p /home/.fake-gpu && echo ecc > /home/.fake-gpu/slonk-cpu-1"
    )
    wait_for("slonk-cpu-1 recycled", lambda: _deletes(cluster, "slonk-cpu-1") > recycled)
    assert _deletes(cluster, "slonk-cpu-0") == before
    assert cluster.nodes()["slonk-cpu-0"] == ("idle+drain", reason)


SECRET = "site-token-" + "7f3a9c"  # in the repository; never in a command line as one word
READS = [
    "/var/lib/slonk/git/hooks/site/token",
    "/var/lib/slonk/git/hooks/prolog.d/10-token",
    "/var/lib/slonk/git/.git/config",
    "/var/lib/slonk/hooks/active/prolog/10-token",
]


def test_job_users_cannot_read_the_hooks_repository(hooks: LocalCluster):
    """Hooks may carry a site's secrets: a job, as its user, reaches nothing of the
    repository on its node (git-sync's tree, `.git` included, nor slonk's copy of the prolog),
    whatever modes the pusher gave the files."""
    commit = hooks.hooks.push(
        {
            "prolog.d/10-token": f"#!/bin/sh\n# {SECRET}\ntrue\n",
            "site/token": f"{SECRET}\n",
        }
    )
    _active_everywhere(hooks, commit)
    pattern = SECRET.replace("-", "[-]")  # the pattern does not match its own command line
    attempt = (
        f"grep -rs '{pattern}' /var/lib/slonk; "
        f"ls -A /var/lib/slonk/git; cat {' '.join(READS)}; echo done"
    )
    for worker in WORKERS:
        assert SECRET in hooks.pod(worker).check_output(f"cat {READS[0]}")  # root reads it
        out = hooks.user().run(f"srun --nodelist={worker} sh -c {shlex.quote(attempt)}")
        seen = out.stdout + out.stderr
        assert "done" in seen, seen  # the job ran
        assert SECRET not in seen
        for path in ["/var/lib/slonk/git", *READS]:
            assert f"{path}': Permission denied" in seen or f"{path}: Permission denied" in seen


def _job_fields(cluster: LocalCluster, job: str) -> str:
    return cluster.pod("slonk-controller-0").run(f"scontrol show job {job}").stdout


def test_a_prolog_failing_on_every_node_drains_only_the_first(hooks: LocalCluster):
    """A prolog calls a tool no image has (exit 127). The job fails on the first node, which
    drains, and is requeued; on the next node it fails the same way. That node stays in
    service and the job is held, saying why: the failure does not walk the partition."""
    broken = hooks.hooks.push({"prolog.d/10-tool": "#!/bin/sh\nno-such-tool --check\n"})
    _active_everywhere(hooks, broken)
    job = hooks.submit("--output=/dev/null", "--wrap", "touch /home/demo/ran-$SLURM_JOB_ID")

    def drained() -> list[str]:
        return [n for n, (state, _) in hooks.nodes().items() if "drain" in state]

    first = wait_for("the first node drained", drained)[0]
    reason = hooks.nodes()[first][1]
    assert reason == f"slonk:hook:prolog:10-tool: exit 127 (revision {broken[:12]})"
    (other,) = set(WORKERS) - {first}
    held = "JobState=PENDING Reason=job_requeued_in_held_state"

    def held_on_other() -> bool:
        """Requeued (nohold_on_prolog_fail), it lands on the other node at once; should Slurm
        delay it (BeginTime, seen only once the requeue is done), it is started now."""
        fields = _job_fields(hooks, job)
        if "Reason=BeginTime" in fields:
            hooks.pod("slonk-controller-0").run(f"scontrol update jobid={job} starttime=now")
        return held in fields

    wait_for(f"job {job} held", held_on_other)
    fields = _job_fields(hooks, job)
    assert f"failed on {other} (exit 127" in fields and f"as on {first} which it drained" in fields
    assert "not drained" in _hook_log(hooks, other, job)
    assert drained() == [first]
    assert hooks.nodes()[other][0] == "idle"
    assert hooks.pod(other).run(f"ls /home/demo/ran-{job}").rc != 0  # the job never ran
    # In service all along: once the script is fixed, jobs run there, no one resuming it.
    fixed = hooks.hooks.push({"prolog.d/10-tool": "#!/bin/sh\ntrue\n"})
    _active_everywhere(hooks, fixed)
    after = hooks.submit(f"--nodelist={other}", "--output=/dev/null", "--wrap", "true")
    wait_for(f"job {after} to finish", lambda: after not in hooks.jobs())
    assert hooks.nodes()[other] == ("idle", "")
