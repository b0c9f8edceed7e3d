"""Hooks values: a git-sync sidecar beside every slurmd, and slurm.conf pointing at slonk."""

from __future__ import annotations

from dataclasses import replace

from slonk.config.render import render

from .test_objects import _container, _spec, _volume


def test_workers_get_a_git_sync_sidecar_sharing_the_hooks_volume(hooks_manifest):
    worker = hooks_manifest.get("StatefulSet/slonk-cpu")
    slurmd, git_sync = worker.spec.template.spec.containers
    assert git_sync.name == "git-sync"
    assert git_sync.image == "registry.k8s.io/git-sync/git-sync:v4.4.0"
    env = {e.name: e.get("value") for e in git_sync.env}
    assert env["GITSYNC_REPO"] == "https://git.example.org/hpc/slurm-hooks.git"
    assert env["GITSYNC_REF"] == "main"
    assert env["GITSYNC_PERIOD"] == "15s"
    assert env["GITSYNC_ROOT"] == "/var/lib/slonk/git"
    assert env["GITSYNC_LINK"] == "hooks"
    assert env["GITSYNC_PASSWORD_FILE"] == "/var/run/secrets/slonk/git/password"
    assert _volume(worker, "hooks").emptyDir == {}
    assert _volume(worker, "git-credentials").secret.secretName == "hooks-git"
    mounts = {m.name: (m.mountPath, m.get("readOnly")) for m in slurmd.volumeMounts}
    assert mounts["hooks"] == ("/var/lib/slonk/git", True)
    controller = hooks_manifest.get("StatefulSet/slonk-controller")
    assert [c.name for c in controller.spec.template.spec.containers] == ["slurmctld"]
    assert _container(controller).name == "slurmctld"


def test_slurm_conf_runs_the_dispatcher(hooks_manifest):
    spec = _spec(hooks_manifest)
    assert dict(spec.hooks.phases) == {
        "prolog": "prolog.d",
        "epilog": "epilog.d",
        "task-prolog": "task-prolog.d",
    }
    lines = render(spec)["slurm.conf"].splitlines()
    assert "Prolog=/run/slonk/bin/prolog" in lines
    assert "Epilog=/run/slonk/bin/epilog" in lines
    assert "TaskProlog=/run/slonk/bin/task-prolog" in lines
    assert not any(line.startswith("TaskEpilog=") for line in lines)
    assert (
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,nohold_on_prolog_fail"
        in lines
    )


def test_no_hooks_and_no_health_checks_no_prolog_and_an_epilog_for_scratch(default_manifest):
    spec = replace(_spec(default_manifest), health=None)
    lines = render(spec)["slurm.conf"].splitlines()
    forked = [line for line in lines if line.startswith(("Prolog=", "Epilog=", "HealthCheck"))]
    assert forked == ["Epilog=/run/slonk/bin/epilog"]
