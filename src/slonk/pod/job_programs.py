"""What a worker keeps in step with cluster.yaml for slurmd: the programs slurm.conf names
(Prolog, Epilog, HealthCheckProgram) and the node's health plan. `slonk init` writes them at
start, `slonk watch-config` again on every change."""

from __future__ import annotations

import sys
from pathlib import Path

import slonk
from slonk.base import paths
from slonk.base.files import write_atomically
from slonk.config.spec import ClusterSpec
from slonk.health import runner
from slonk.hooks import revision


def job_phase_arguments(phase: str) -> str:
    """The interpreter's arguments for a Prolog/Epilog: it runs for every job, so it starts
    isolated (-I: no PYTHON* variables from slurmd's environment, no user site) and without
    `site` (-S: the venv's and Debian's package directories, a third of a bare start's
    time), finding slonk where this slonk is; the job-time modules need nothing else."""
    where = Path(slonk.__file__).resolve().parent.parent
    code = (
        f"import sys; sys.path.append({str(where)!r}); "
        "from slonk.hooks.dispatch import main; main()"
    )
    return f'-I -S -c "{code}" {phase}'


def install_job_programs(spec: ClusterSpec) -> str:
    """The programs slurm.conf names (Prolog, Epilog, HealthCheckProgram): this interpreter
    running the dispatcher or the health checks. slurmd gives them no PATH of their own."""
    paths.HOOK_BIN.mkdir(parents=True, exist_ok=True)
    programs = {phase: job_phase_arguments(phase) for phase in spec.job_phases}
    if spec.health:
        programs["health"] = "-m slonk.health.command"
    for name, arguments in programs.items():
        # Through a rename: slurmd may start one at any moment (every job, every interval),
        # and must find the old program or the new, never an empty one (nor refuse the write
        # with ETXTBSY while it starts one).
        write_atomically(
            paths.HOOK_BIN / name,
            f'#!/bin/sh\nexport PATH="${{PATH:-{paths.DEFAULT_PATH}}}"\n'
            f"exec {sys.executable} {arguments}\n",
            mode=0o755,
        )
    if spec.hooks:
        revision.write_settings(spec.hooks)
    return ", ".join(programs)


def update_node_programs(spec: ClusterSpec, name: str) -> str:
    """After a change of cluster.yaml: node `name`'s health plan and job programs follow it."""
    install_job_programs(spec)
    plan = runner.plan_for(spec, name)
    if plan:
        runner.write_plan(plan)
    else:
        paths.HEALTH_PLAN.unlink(missing_ok=True)
    return "updated the health plan and job programs"
