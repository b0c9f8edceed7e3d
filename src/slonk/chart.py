"""`slonk chart template`: render the chart through Helm's Go library, no helm binary."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from slonk import paths
from slonk.errors import SlonkError

# Helm's install order (pkg/release/util/kind_sorter.go): `helm template` prints in this order.
INSTALL_ORDER = (
    "PriorityClass Namespace NetworkPolicy ResourceQuota LimitRange PodSecurityPolicy "
    "PodDisruptionBudget ServiceAccount Secret SecretList ConfigMap StorageClass "
    "PersistentVolume PersistentVolumeClaim CustomResourceDefinition ClusterRole "
    "ClusterRoleList ClusterRoleBinding ClusterRoleBindingList Role RoleList RoleBinding "
    "RoleBindingList Service DaemonSet Pod ReplicationController ReplicaSet Deployment "
    "HorizontalPodAutoscaler StatefulSet Job CronJob IngressClass Ingress APIService"
).split()
_ORDER = {kind: rank for rank, kind in enumerate(INSTALL_ORDER)}
# A line that is `---` (trailing blanks allowed) separates documents. The pattern starts with a
# literal so that re scans for it quickly: 15,000 documents split in milliseconds. Text is
# given a leading newline so that a separator on the first line is found too.
_DOC_SPLIT = re.compile(r"\n---[ \t]*(?=\n|$)")
_KIND = re.compile(r"^kind:\s*(\S+)", re.MULTILINE)


class ChartError(SlonkError):
    """The chart, its values or a template refused to render; the message says where."""


def default_chart() -> Path:
    chart = paths.chart_dir()
    if chart is None:
        raise ChartError("no chart found: give its path or set SLONK_CHART")
    return chart


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's merge of values files: maps merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _helm() -> Any:
    """Helm's Go library, loaded only when rendering: pods start faster, and images, which
    never render, leave it out (the `chart` extra)."""
    try:
        import helm_python
    except ImportError:
        raise ChartError(
            "rendering the chart needs Helm's library: pip install 'slonk[chart]'"
        ) from None
    return helm_python


def user_values(
    files: Iterable[Path] = (), sets: Iterable[str] = (), set_strings: Iterable[str] = ()
) -> dict[str, Any]:
    """Values as `helm template -f ... --set ... --set-string ...` composes them."""
    helm_python = _helm()

    values: dict[str, Any] = {}
    try:
        for path in files:
            try:
                text = Path(path).read_text()
            except OSError as err:
                raise ChartError(f"{path}: cannot read values file: {err.strerror}") from err
            values = deep_merge(values, helm_python.values_from_yaml(text) or {})
        for expression in sets:
            values = deep_merge(values, helm_python.parse_set_string(expression))
        for expression in set_strings:
            values = deep_merge(values, helm_python.parse_set_string_values(expression))
    except helm_python.HelmValuesError as err:
        raise ChartError(str(err)) from err
    return values


def render(
    chart: Path, values: Mapping[str, Any], release: str = "slonk", namespace: str = "default"
) -> dict[str, str]:
    """Every template's output, by template path (NOTES.txt included)."""
    helm_python = _helm()

    try:
        with helm_python.Chart.load(chart) as loaded:
            return loaded.render(dict(values), name=release, namespace=namespace, is_install=True)
    except helm_python.HelmError as err:
        raise ChartError(str(err)) from err


def kind_of(document: str) -> str:
    """The kind a YAML document's top-level `kind:` line names; "" without one."""
    found = _KIND.search(document)
    return found.group(1) if found else ""


def _has_content(body: str) -> bool:
    """Not blank, and not only comments (Helm leaves such documents out too)."""
    if not body:
        return False
    if not body.startswith("#"):
        return True
    return any(not line.lstrip().startswith("#") for line in body.splitlines())


def documents(rendered: Mapping[str, str]) -> list[tuple[str, str]]:
    """(template path, YAML document) pairs in Helm's install order, NOTES and blanks left out."""
    docs = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        for doc in _DOC_SPLIT.split("\n" + rendered[path]):
            body = doc.strip()
            if _has_content(body):
                docs.append((path, body))
    last = len(INSTALL_ORDER)
    return sorted(docs, key=lambda item: _ORDER.get(kind_of(item[1]), last))


def manifest(rendered: Mapping[str, str]) -> str:
    """The stream `helm template` prints."""
    return "".join(f"---\n# Source: {path}\n{body}\n" for path, body in documents(rendered))
