"""The chart lints strictly, renders documents Kubernetes accepts, and refuses bad values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from slonk.kube import chart

from .conftest import VALUES

VALUE_SETS = [
    [],
    ["gpu-pools.yaml"],
    ["existing.yaml"],
    ["nfs-home.yaml"],
    ["ldap.yaml"],
    ["ldap-dev.yaml"],
    ["hooks.yaml"],
    ["network.yaml"],
    ["metrics.yaml"],
]
# Custom resources Kubernetes' own schemas do not know: their shape is tested where the chart
# makes them (the PodMonitor: test_metrics.py).
CUSTOM_API_GROUPS = ("monitoring.coreos.com/",)


def _values(files: list[str]) -> dict:
    return chart.user_values([VALUES / f for f in files])


@pytest.mark.parametrize("files", VALUE_SETS, ids=lambda f: "+".join(f) or "defaults")
@pytest.mark.parametrize("kube_version", ["v1.29.0", "v1.33.0"])
def test_strict_lint_is_clean(files, kube_version):
    report = helm_python.lint(
        chart.default_chart(), _values(files), strict=True, kube_version=kube_version
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert problems == []


@pytest.mark.parametrize("files", VALUE_SETS, ids=lambda f: "+".join(f) or "defaults")
@pytest.mark.parametrize("kube_version", ["1.29", "1.33"])
def test_every_document_is_valid_kubernetes(files, kube_version):
    manifest = chart.manifest(chart.render(chart.default_chart(), _values(files)))
    docs = list(yaml.safe_load_all(manifest))
    assert docs
    for doc in docs:
        if not doc["apiVersion"].startswith(CUSTOM_API_GROUPS):
            kubernetes_validate.validate(doc, kube_version, strict=True)


def _template_error(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "slonk.cli", "chart", "template", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    return result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "nodepool.replicas=2"], "at '': additional properties 'nodepool' not allowed"),
        (["--set", "login.replica=2"], "at '/login': additional properties 'replica' not allowed"),
        (["--set", "login.replicas=-1"], "at '/login/replicas': minimum: got -1, want 0"),
        (
            ["--set", "nodepools.cpu.replicas=-2"],
            "at '/nodepools/cpu/replicas': minimum: got -2, want 0",
        ),
        (
            [
                "--set",
                "nodepools.gpu.replicas=1,nodepools.gpu.cpus=1,"
                "nodepools.gpu.memoryMiB=1,nodepools.gpu.gpus.type=h100",
            ],
            "at '/nodepools/gpu/gpus': missing property 'count'",
        ),
        (
            [
                "--set",
                "nodepools.Bad_Name.replicas=1,nodepools.Bad_Name.cpus=1,"
                "nodepools.Bad_Name.memoryMiB=1",
            ],
            "invalid propertyName 'Bad_Name'",
        ),
        (["--set", "slurm.confinement=docker"], "at '/slurm/confinement'"),
        (
            ["--set", "partitions.main.pools={tpu}"],
            'partitions.main.pools[0]: unknown nodepool "tpu"',
        ),
        (
            ["--set", "partitions.b.pools={cpu},partitions.b.default=true"],
            "partitions.main.default: only one partition can be the default (b is)",
        ),
        (["--name", "Slonk"], 'release name "Slonk": must be a DNS-1123 label'),
        (["--set", "ldap.enabled=true"], "ldap.uris: required when ldap.enabled is true"),
        (["--set", "hooks.enabled=true"], "hooks.git.repo: required when hooks.enabled is true"),
        (["--set", "hooks.prolog=../etc"], "at '/hooks/prolog'"),
        (["--set", "ldap.tls=ssl"], "at '/ldap/tls'"),
        (["--set", "ldap.maxRemovalPercent=150"], "at '/ldap/maxRemovalPercent'"),
        (
            ["--set", "health.checks.gpu.nvidiaSmii=x"],
            "at '/health/checks/gpu': additional properties 'nvidiaSmii' not allowed",
        ),
        (
            ["--set", "health.checks.scratch.minFreePercent=101"],
            "at '/health/checks/scratch/minFreePercent'",
        ),
        (["--set", "health.checks.dns.phases={always}"], "at '/health/checks/dns/phases/0'"),
        (["--set", "health.recycle.maxRecycles=0"], "at '/health/recycle/maxRecycles'"),
        (["--set-string", "capacity.returnOnDemand=yes"], "at '/capacity/returnOnDemand'"),
        (
            ["--set", "capacity.returnOnDemnd=true"],
            "at '/capacity': additional properties 'returnOnDemnd' not allowed",
        ),
    ],
)
def test_bad_values_fail_with_the_key_path(args, message):
    assert message in _template_error(*args)


def test_pools_and_partitions_as_lists_fail_showing_the_maps(tmp_path):
    """The form before chart 0.4.0: the error shows the map to write instead."""
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "nodepools": [{"name": "cpu", "replicas": 1, "cpus": 1, "memoryMiB": 100}],
                "partitions": [{"name": "main", "pools": ["cpu"], "default": True}],
            }
        )
    )
    assert (
        "nodepools: a list, the form before chart 0.4.0; write a map keyed by name instead: "
        'nodepools: {"cpu":{"cpus":1,"memoryMiB":100,"replicas":1}}'
        in _template_error("-f", str(values))
    )
    values.write_text(yaml.safe_dump({"partitions": [{"name": "main", "pools": ["cpu"]}]}))
    assert (
        "partitions: a list, the form before chart 0.4.0; write a map keyed by name "
        'instead: partitions: {"main":{"pools":["cpu"]}}' in _template_error("-f", str(values))
    )


def test_pools_and_partitions_merge_across_values_files(tmp_path):
    """Maps merge key by key: an overlay changes one pool, adds one, or removes one."""
    base, overlay = tmp_path / "base.yaml", tmp_path / "overlay.yaml"
    base.write_text(
        yaml.safe_dump({"nodepools": {"big": {"replicas": 1, "cpus": 8, "memoryMiB": 100}}})
    )
    # (ghost: a null for a pool no file sets, which Helm keeps as a null: nothing.)
    overlay.write_text(
        yaml.safe_dump({"nodepools": {"cpu": {"replicas": 5}, "big": None, "ghost": None}})
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "slonk.cli",
            "chart",
            "template",
            "-f",
            str(base),
            "-f",
            str(overlay),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    sets = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "StatefulSet"]
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in sets} == {
        "slonk-controller": 1,
        "slonk-login": 1,
        "slonk-cpu": 5,
        "slonk-mariadb": 1,
        "slonk-slurmdbd": 1,
    }


def _one_pool(tmp_path, name: str) -> str:
    values = tmp_path / "values.yaml"
    pool = {"replicas": 10000, "cpus": 1, "memoryMiB": 100}
    values.write_text(
        yaml.safe_dump({"nodepools": {"cpu": None, name: pool}, "partitions": {"main": None}})
    )
    return str(values)


def test_a_statefulset_name_beyond_52_characters_fails(tmp_path):
    """Kubernetes labels a StatefulSet's pods with its name and an 11-character revision
    hash (63 at most): a longer name renders, applies, and never makes a pod."""
    values = chart.user_values([Path(_one_pool(tmp_path, "p" * 46))])  # slonk-ppp…: 52
    docs = yaml.safe_load_all(chart.manifest(chart.render(chart.default_chart(), values)))
    names = {d["metadata"]["name"] for d in docs if d and d["kind"] == "StatefulSet"}
    assert f"slonk-{'p' * 46}" in names
    assert (
        f'nodepools.{"p" * 47}: StatefulSet name "slonk-{"p" * 47}" is longer than 52 '
        "characters" in _template_error("-f", _one_pool(tmp_path, "p" * 47))
    )


def test_a_release_name_beyond_41_characters_fails():
    """The chart names the controller's StatefulSet <release>-controller."""
    assert 'release name "' + "r" * 42 + '": must be a DNS-1123 label of at most 41' in (
        _template_error("--name", "r" * 42)
    )


def test_unreadable_values_file():
    assert "missing.yaml: cannot read values file" in _template_error("-f", "missing.yaml")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nodepools": [{"name": "cpu"}, "x"]}, "at '/nodepools/1': got string, want object"),
        ({"partitions": [3]}, "at '/partitions/0': got number, want object"),
    ],
)
def test_an_old_list_holding_no_map_fails_naming_the_item(tmp_path, values, message):
    """The list form is refused with the map to write (test_parity); an item that is no map
    at all must not reach the templates, which would fail on it in Go's words."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert message in _template_error("-f", str(path))
