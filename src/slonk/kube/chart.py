"""`slonk chart template`: render the chart through Helm's Go library, no helm binary."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slonk.base import paths
from slonk.base.errors import SlonkError

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


# `slonk chart template` renders in a child process whose data segment is capped
# (RLIMIT_DATA: the heap, Go's arenas in use, thread stacks; not the address space Go only
# reserves): a values file or chart that would grow without end fails the child, and the
# command refuses it naming the bound, instead of the kernel killing the machine's largest
# process. Values within the schema and slonk.boundNodes render in far less: 15,000 nodes in
# 20 pools peak at about 110 MiB resident, the chart's largest, 20,000 nodes in 100 pools, at
# about 115 MiB (tests/chart/test_render_bounds.py measures both). Resident memory may pass
# the bound by the code mapped from files, which it does not count (Helm's library: 85 MB).
# GOMAXPROCS caps Go's threads, whose stacks count, so that the bound holds on any machine.
RENDER_MEMORY_BYTES = 512 * 1024 * 1024
RENDER_TIMEOUT_SECONDS = 120
_RENDER_THREADS = str(min(4, os.cpu_count() or 1))
# The render child's statuses beside 0: the chart refused (its message on stderr), and
# Python's own allocation failed (Go's dies with SIGABRT, saying so).
_REFUSED, _OUT_OF_MEMORY = 10, 11
# How Go's runtime says it at a limit (`fatal error: runtime: out of memory`, `... out of memory
# allocating heap arena metadata`, a thread it could not start), dying with SIGABRT.
_GO_OUT_OF_MEMORY = re.compile(
    r"^fatal error: .*out of memory|failed to create new OS thread|cannot allocate memory",
    re.MULTILINE,
)
# -P: the working directory is not put on the child's import path (a json.py there would run).
_CHILD = ("-P", "-c", "import sys; from slonk.kube.chart import _serve; sys.exit(_serve())")


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
    for path in files:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ChartError(f"{path}: cannot read values file: {err.strerror}") from err
        values = deep_merge(values, _parsed(str(path), helm_python.values_from_yaml, text))
    for expression in sets:
        values = deep_merge(values, _parsed("--set", helm_python.parse_set_string, expression))
    for expression in set_strings:
        parse = helm_python.parse_set_string_values
        values = deep_merge(values, _parsed("--set-string", parse, expression))
    return values


def _parsed(source: str, parse: Callable[[str], Any], text: str) -> dict[str, Any]:
    """One values file's or option's values; an error names where they came from. Helm's
    parser stops at 10,000 levels of nesting, Python's reader of its answer near 1,000."""
    helm_python = _helm()
    try:
        return parse(text) or {}
    except helm_python.HelmValuesError as err:
        raise ChartError(f"{source}: {err}") from err
    except RecursionError:
        raise ChartError(f"{source}: values nested too deeply") from None


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


def template(
    chart: Path | None,
    files: Iterable[Path] = (),
    sets: Iterable[str] = (),
    set_strings: Iterable[str] = (),
    release: str = "slonk",
    namespace: str = "default",
) -> str:
    """`slonk chart template`: what `helm template` prints, composed, rendered and ordered in a
    child process held to RENDER_MEMORY_BYTES and RENDER_TIMEOUT_SECONDS."""
    request = {
        "chart": None if chart is None else str(chart),
        "files": [str(path) for path in files],
        "sets": list(sets),
        "set_strings": list(set_strings),
        "release": release,
        "namespace": namespace,
    }
    try:
        done = subprocess.run(
            [sys.executable, *_CHILD, str(RENDER_MEMORY_BYTES)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=RENDER_TIMEOUT_SECONDS,
            env={**os.environ, "GOMAXPROCS": _RENDER_THREADS},
        )
    except subprocess.TimeoutExpired:
        raise ChartError(
            f"rendering took longer than {RENDER_TIMEOUT_SECONDS} s, slonk's bound for a "
            "render: refused"
        ) from None
    if done.returncode == 0:
        sys.stderr.write(done.stderr)  # Helm's warnings, as `helm template` prints them
        return done.stdout
    raise ChartError(_child_failure(done.returncode, done.stderr))


def _child_failure(status: int, stderr: str) -> str:
    """What the render child's exit means: the chart's own error as it gave it, the bound it
    ran into, or how it died."""
    if status == _REFUSED:
        return stderr.strip()
    if status == _OUT_OF_MEMORY or _GO_OUT_OF_MEMORY.search(stderr):
        return (
            f"rendering needs more than {RENDER_MEMORY_BYTES >> 20} MiB of memory, slonk's "
            "bound for a render: refused"
        )
    how = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    return f"the renderer stopped with {how}: {last}"


def _serve() -> int:
    """The render child: caps its own data segment first, then reads template()'s request on
    stdin and prints the manifest, or the chart's error on stderr."""
    limit = int(sys.argv[1])
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        request = json.load(sys.stdin)
        values = user_values(map(Path, request["files"]), request["sets"], request["set_strings"])
        chart = Path(request["chart"]) if request["chart"] else default_chart()
        text = manifest(render(chart, values, request["release"], request["namespace"]))
    except ChartError as err:
        sys.stderr.write(f"{err}\n")
        return _REFUSED
    except MemoryError:
        return _OUT_OF_MEMORY
    sys.stdout.write(text)
    return 0
