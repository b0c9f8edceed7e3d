"""How slonk's modules depend on each other: each imports only from the layers below its own
(pyproject.toml's contract, checked by import-linter in ci/lint), a pod's commands load no
local mode (nor its HTTP server's http.server and ssl), the pods' modules import no CLI of
another's, and every user-facing error ends a command in one line, not a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slonk
from slonk import cli, init
from slonk.base.errors import SlonkError
from slonk.config.spec import SpecError
from slonk.kube import api, chart
from slonk.local import cluster, manifests, network, pod, podman
from slonk.pod import secrets
from slonk.slurm import slurm_state, statesave
from slonk.users import directory, sync

# Local mode's, and what only its fake API server needs. Pods need ssl for LDAP (ldap3), so
# only the commands that never talk to a directory are held to it.
LOCAL = ("slonk.local", "http.server")
NO_SSL = ("ssl",)


LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def _lint_imports(source: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the copy of slonk in `source`, with the project's contract."""
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--config", PYPROJECT],
        env={**os.environ, "PYTHONPATH": str(source)},
        capture_output=True, text=True, cwd=source, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(("change", "said"), [
    (("base/paths.py", "\nfrom slonk.health import drains\n"),
     "slonk.base is not allowed to import slonk.health"),
    (("config/spec.py", "\nimport slonk.align.recycle\n"),  # lazily or not, upward
     "slonk.config is not allowed to import slonk.align"),
    (("unplaced.py", ""), "unplaced"),  # a new module takes its place in the contract
])  # fmt: skip
def test_the_layer_contract_holds_and_refuses_an_upward_import(change, said, tmp_path):
    shutil.copytree(
        Path(slonk.__file__).parent, tmp_path / "slonk", ignore=shutil.ignore_patterns("*.pyc")
    )
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0, kept.stdout[-2000:]
    name, text = change
    with (tmp_path / "slonk" / name).open("a") as module:
        module.write(text)
    broken = _lint_imports(tmp_path)
    assert broken.returncode == 1, broken.stdout[-2000:]
    assert said in broken.stdout


def _loaded_by_cli(*args: str, cwd) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules `slonk ARGS` imported, as `python -X importtime` lists them."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "slonk.cli", *args],
        capture_output=True, text=True, cwd=cwd, check=False,
    )  # fmt: skip
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and not line.endswith("imported package")
    }
    assert modules, done.stderr
    return modules, done


def _loaded_by_import(*modules: str) -> set[str]:
    """sys.modules in a fresh interpreter after importing `modules`."""
    code = f"import sys, {', '.join(modules)}; print(*sys.modules, sep='\\n')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def _of(modules: set[str], *prefixes: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in prefixes))


@pytest.mark.parametrize(("args", "code", "unwanted"), [
    # the commands pods run, as far as each goes without a pod around it
    (["init", "--help"], 0, LOCAL),
    (["agent", "--help"], 0, LOCAL + NO_SSL),
    (["users", "sync", "--cluster", "missing.yaml"], 1, LOCAL),
    (["hooks", "status"], 0, LOCAL + NO_SSL),
    (["hooks", "run", "--help"], 0, LOCAL + NO_SSL),
    (["health", "run"], 2, LOCAL + NO_SSL),  # no health plan here
    (["syncer", "--cluster", "missing.yaml"], 1, LOCAL + NO_SSL),
    (["align", "--cluster", "missing.yaml"], 1, LOCAL + NO_SSL),
    (["pool", "--cluster", "missing.yaml", "scale", "cpu", "1"], 1, LOCAL + NO_SSL),
    (["worker", "--node", "x", "down"], 1, LOCAL + NO_SSL),  # no Slurm here
    (["power", "resume", "--", "n[1-2]"], 1, LOCAL + NO_SSL),  # no slurmctld state dir here
])  # fmt: skip
def test_a_pods_command_loads_no_local_mode(args, code, unwanted, tmp_path):
    modules, done = _loaded_by_cli(*args, cwd=tmp_path)
    assert done.returncode == code, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert _of(modules, *unwanted) == []


@pytest.mark.parametrize("args", [["--help"], ["local", "--help"], ["local", "up", "--help"],
                                  ["chart", "template", "--help"]])  # fmt: skip
def test_every_command_is_still_listed_and_local_modes_help_works(args, tmp_path):
    modules, done = _loaded_by_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    if args == ["--help"]:
        assert all(name in done.stdout for name in cli.COMMANDS)
        assert _of(modules, *LOCAL) == []
    if args[:2] == ["local", "up"]:
        assert "--state-dir" in done.stdout and "--runtime" in done.stdout


@pytest.mark.parametrize("module", [
    "slonk.cli", "slonk.init", "slonk.pod_agent", "slonk.pod.config_watch",
    "slonk.pod.job_programs",
    "slonk.users.sync", "slonk.hooks.dispatch", "slonk.hooks.revision", "slonk.health.command",
    "slonk.health.drains", "slonk.align.recycle", "slonk.kube.api", "slonk.align.syncer",
    "slonk.align.pool",
])  # fmt: skip
def test_the_pods_modules_import_no_local_mode(module):
    assert _of(_loaded_by_import(module), *LOCAL) == []


def test_dependencies_point_one_way():
    """A command's module is imported by no other module: config-watch runs no `init`, a
    job's hooks no `health` CLI; what both need lives below them."""
    assert (
        _of(_loaded_by_import("slonk.pod.config_watch", "slonk.pod.job_programs"), "slonk.init")
        == []
    )
    # A worker's config-watch renders no Slurm configuration: the controller's does.
    assert (
        _of(_loaded_by_import("slonk.pod.config_watch", "slonk.pod.job_programs"), "jinja2") == []
    )
    job_time = _loaded_by_import("slonk.hooks.dispatch", "slonk.health.drains")
    assert _of(job_time, "slonk.health.command", "slonk.cli", "slonk.init") == []
    # Prolog and Epilog run for every job: no YAML, no spec.
    assert _of(_loaded_by_import("slonk.hooks.dispatch"), "yaml", "slonk.config") == []


USER_ERRORS = [
    chart.ChartError, SpecError, manifests.LocalModeError, network.NetworkError,
    podman.PodmanError, pod.PodError, init.InitError, secrets.MissingSecret,
    statesave.StateError, slurm_state.SlurmError, api.KubeError, directory.DirectoryError,
    sync.SyncRefused,
]  # fmt: skip


def test_every_user_facing_error_is_a_slonk_error():
    assert all(issubclass(error, SlonkError) for error in USER_ERRORS)
    assert issubclass(SpecError, ValueError)  # what callers caught before


@pytest.mark.parametrize("error", USER_ERRORS)
def test_a_user_error_ends_a_command_in_one_line(error, monkeypatch, tmp_path, capsys):
    """PodError (a pod that did not start) ended `slonk local restart` in a traceback."""

    def refuse(*args, **kwargs):
        raise error("what to fix")

    monkeypatch.setattr(cluster, "restart", refuse)
    assert cli.main(["local", "restart", "slonk-cpu-0", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "slonk: error: what to fix\n"


def test_the_command_after_the_double_dash_is_not_the_sub_command(tmp_path, capsys):
    """`exec POD` with nothing after `--`: the argv is empty, whatever the sub-command."""
    assert cli.main(["local", "exec", "slonk-cpu-0", "--state-dir", str(tmp_path)]) == 1
    assert "exec needs a command" in capsys.readouterr().err
