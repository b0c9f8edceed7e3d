"""`helm upgrade` from the previous release: a StatefulSet's selector, serviceName,
volumeClaimTemplates and podManagementPolicy can never change (Kubernetes refuses the update),
so they must render exactly as the previous release rendered them."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk import chart

from .conftest import VALUES

REPO = Path(__file__).resolve().parents[2]
CHART = "charts/slonk"
IMMUTABLE = ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy")
VALUE_SETS = [[], ["gpu-pools.yaml"], ["existing.yaml"], ["ldap-dev.yaml"], ["hooks.yaml"]]


def _git(*args: str) -> str | None:
    result = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return result.stdout if result.returncode == 0 else None


def _version(text: str | None) -> str | None:
    return yaml.safe_load(text)["version"] if text else None


def previous_release() -> str | None:
    """The commit users upgrade from: the last one before this chart version was set (the
    previous release); while no release came before, where this branch left main. None
    without git history."""
    current = _version((REPO / CHART / "Chart.yaml").read_text())
    if _version(_git("show", f"HEAD:{CHART}/Chart.yaml")) not in (None, current):
        return "HEAD"  # the version bump is not committed yet
    for commit in (_git("log", "--format=%H", "HEAD", "--", f"{CHART}/Chart.yaml") or "").split():
        before = _version(_git("show", f"{commit}^:{CHART}/Chart.yaml"))
        if before is None:
            break
        if before != current:
            return f"{commit}^"
    fork = _git("merge-base", "HEAD", "main")
    return fork.strip() if fork else None


@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    commit = previous_release()
    archive = commit and subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, CHART],
        capture_output=True, check=False,
    )
    if not archive or archive.returncode:
        pytest.skip("no git history to find the previous release in")
    root = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root / CHART


def _statefulsets(chart_dir: Path, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all(chart.manifest(chart.render(chart_dir, values, namespace="hpc")))
    return {d["metadata"]["name"]: d["spec"] for d in docs if d and d["kind"] == "StatefulSet"}


@pytest.mark.parametrize("files", VALUE_SETS, ids=lambda f: "+".join(f) or "defaults")
def test_statefulsets_keep_their_immutable_fields(previous_chart, files):
    values = chart.user_values([VALUES / f for f in files])
    try:
        before = _statefulsets(previous_chart, values)
    except chart.ChartError as err:
        pytest.skip(f"the previous release refuses these values: {err}")
    after = _statefulsets(chart.default_chart(), values)
    assert sorted(after) == sorted(before), "a renamed StatefulSet loses its volumes"
    for name, spec in before.items():
        for key in IMMUTABLE:
            assert after[name].get(key) == spec.get(key), f"StatefulSet {name}: spec.{key}"
