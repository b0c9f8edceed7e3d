"""`helm upgrade` from the previous release: a StatefulSet's selector, serviceName,
volumeClaimTemplates and podManagementPolicy can never change (Kubernetes refuses the update),
so they must render exactly as the previous release rendered them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk.kube import chart

from .conftest import VALUES

REPO = Path(__file__).resolve().parents[2]
CHART = "charts/slonk"
IMMUTABLE = ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy")
VALUE_SETS = [[], ["gpu-pools.yaml"], ["existing.yaml"], ["ldap-dev.yaml"], ["hooks.yaml"]]
# StatefulSets a release may add (an upgrade creates them; it renames nothing): accounting's,
# new in chart 0.6.0.
ADDED = {"slonk-slurmdbd", "slonk-mariadb"}


def _git(*args: str) -> str | None:
    result = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return result.stdout if result.returncode == 0 else None


def _version(text: str | None) -> str | None:
    return yaml.safe_load(text)["version"] if text else None


def previous_release() -> str | None:
    """The commit users upgrade from. On a branch that changes the chart version: where it
    left main (its own commits before the bump are no release). Otherwise the main line's
    (first-parent) commit before this chart version was set; a merge that sets it counts as
    the main line's. None without git history."""
    current = _version((REPO / CHART / "Chart.yaml").read_text())
    fork = (_git("merge-base", "HEAD", "main") or "").strip()
    if fork and _version(_git("show", f"{fork}:{CHART}/Chart.yaml")) not in (None, current):
        return fork
    if _version(_git("show", f"HEAD:{CHART}/Chart.yaml")) not in (None, current):
        return "HEAD"  # the version bump is not committed yet
    log = _git("log", "--first-parent", "--format=%H", "HEAD", "--", f"{CHART}/Chart.yaml")
    for commit in (log or "").split():
        before = _version(_git("show", f"{commit}^:{CHART}/Chart.yaml"))
        if before is None:
            break
        if before != current:
            return f"{commit}^"
    return fork or None


def _previous(tmp_path_factory: pytest.TempPathFactory, path: str) -> Path:
    """`path` of the previous release, extracted."""
    commit = previous_release()
    archive = commit and subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, path],
        capture_output=True,
        check=False,
    )
    if not archive or archive.returncode:
        pytest.skip("no git history to find the previous release in")
    root = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root / path


@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _previous(tmp_path_factory, CHART)


@pytest.fixture(scope="module")
def previous_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's package: what its pods' images run."""
    return _previous(tmp_path_factory, "src")


def _statefulsets(chart_dir: Path, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all(chart.manifest(chart.render(chart_dir, values, namespace="hpc")))
    return {d["metadata"]["name"]: d["spec"] for d in docs if d and d["kind"] == "StatefulSet"}


NAMED = ("nodepools", "partitions")


def _takes_lists(chart_dir: Path) -> bool:
    """Charts before 0.4.0 take node pools and partitions as lists of named items."""
    defaults = yaml.safe_load((chart_dir / "values.yaml").read_text())
    return isinstance(defaults["nodepools"], list)


def _list_form(values: dict[str, Any]) -> dict[str, Any]:
    """The same pools and partitions as chart 0.3.0's values spell them: the maps merged
    over this chart's defaults (null removes an entry), each a list of named items."""
    defaults = yaml.safe_load((chart.default_chart() / "values.yaml").read_text())
    old = dict(values)
    for key in NAMED:
        merged = chart.deep_merge(defaults[key], values.get(key) or {})
        old[key] = [{"name": name, **item} for name, item in merged.items() if item is not None]
    return old


@pytest.mark.parametrize("files", VALUE_SETS, ids=lambda f: "+".join(f) or "defaults")
def test_statefulsets_keep_their_immutable_fields(previous_chart, files):
    values = chart.user_values([VALUES / f for f in files])
    # Keys the previous release does not know yet (its schema would refuse them).
    known = yaml.safe_load((previous_chart / "values.yaml").read_text())
    values_before = {key: value for key, value in values.items() if key in known}
    try:
        old = _list_form(values_before) if _takes_lists(previous_chart) else values_before
        before = _statefulsets(previous_chart, old)
    except chart.ChartError as err:
        pytest.skip(f"the previous release refuses these values: {err}")
    after = _statefulsets(chart.default_chart(), values)
    assert set(before) <= set(after), "a renamed StatefulSet loses its volumes"
    assert set(after) - set(before) <= ADDED, "a StatefulSet this test does not know is added"
    for name, spec in before.items():
        for key in IMMUTABLE:
            assert after[name].get(key) == spec.get(key), f"StatefulSet {name}: spec.{key}"


@pytest.mark.parametrize("files", VALUE_SETS, ids=lambda f: "+".join(f) or "defaults")
def test_values_of_the_list_form_are_refused_with_the_maps_to_write(previous_chart, files):
    """An upgrade from 0.3.0 with its values unchanged fails before anything is applied, and
    the error shows the map each list becomes: written out, the upgrade renders as above."""
    if not _takes_lists(previous_chart):
        pytest.skip("the previous release takes maps already")
    old = _list_form(chart.user_values([VALUES / f for f in files]))
    with pytest.raises(chart.ChartError) as caught:
        chart.render(chart.default_chart(), old, namespace="hpc")
    message = str(caught.value)
    assert "nodepools: a list, the form before chart 0.4.0; write a map keyed by name " in message
    shown = json.loads(message.split("instead: nodepools: ", 1)[1].splitlines()[0])
    assert shown == {item.pop("name"): item for item in old["nodepools"]}


def test_the_databases_claim_is_frozen_as_every_claim():
    """The MariaDB claim's labels never follow the chart's version (an upgrade would change
    the volumeClaimTemplate, which Kubernetes refuses): slonk.claimLabels."""
    spec = _statefulsets(chart.default_chart(), {})["slonk-mariadb"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["labels"]["helm.sh/chart"] == "slonk-0.1.0"
    assert claim["metadata"]["labels"]["app.kubernetes.io/version"] == "0.1.0"
    assert claim["metadata"]["labels"]["app.kubernetes.io/component"] == "mariadb"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    resized = {"accounting": {"database": {"persistence": {"size": "5Gi", "storageClass": "ssd"}}}}
    mariadb = _statefulsets(chart.default_chart(), resized)["slonk-mariadb"]
    (claim,) = mariadb["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"


@pytest.mark.parametrize("files", VALUE_SETS, ids=lambda f: "+".join(f) or "defaults")
def test_the_previous_releases_pods_take_this_releases_cluster_yaml(previous_code, files):
    """Worker pods are replaced as they drain (OnDelete), so pods of the previous images read
    the new cluster.yaml for a while: with its defaults it holds no key they do not know (a
    pod refuses one, keeping its old configuration; values.yaml leaves new keys unset)."""
    values = chart.deep_merge(
        chart.user_values([VALUES / f for f in files]),
        {"health": {"active": {"enabled": True}, "trends": {"enabled": True}}},
    )
    rendered = chart.render(chart.default_chart(), values)
    spec = yaml.safe_load(rendered["slonk/templates/cluster-configmap.yaml"])["data"]
    parse = (
        f"import sys, yaml; sys.path.insert(0, {str(previous_code)!r}); "
        "from slonk.config.spec import parse_spec; parse_spec(yaml.safe_load(sys.stdin))"
    )
    older = subprocess.run(
        [sys.executable, "-I", "-c", parse],
        input=spec["cluster.yaml"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert older.returncode == 0, older.stderr.strip().splitlines()[-1:]
