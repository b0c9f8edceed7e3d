"""Values that would make the renderer eat the machine are refused quickly, naming the key.

Issue 28: a two-line values file in the list form of chart 0.3 with a count of 100,000,000
replicas passed the schema, a template looped over it, and the renderer grew to 23 GB before
the kernel killed it (a GitOps controller rendering it would die the same way). Now the schema
bounds every loop's input in either form, `slonk.boundNodes` bounds the total of nodes (which
no schema can sum) before any template loops over nodes, and `slonk chart template` renders
in a child held to `chart.RENDER_MEMORY_BYTES` of data. Each case runs the real command and
measures it from outside: its status, its time, its peak resident memory (children included).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from slonk.config import contract
from slonk.kube import chart

from .conftest import VALUES

BOUND = chart.RENDER_MEMORY_BYTES
# Resident memory beyond the data bound: code mapped from files (Helm's library is 85 MB),
# which RLIMIT_DATA does not count.
CODE = 160 << 20
# "Quickly": a refusal takes about half a second here; this leaves room for a loaded machine.
QUICK_SECONDS = 20
POOL = {"replicas": 1, "cpus": 2, "memoryMiB": 1024}


@dataclass
class Run:
    status: int
    stdout: str
    stderr: str
    seconds: float
    peak_bytes: int  # the largest resident set of the command and its children


def _measured(command: list[str], tmp_path: Path) -> Run:
    """Runs a command, its output to files, and reaps it with wait4 for its peak memory."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
    return Run(process.returncode, out.read_text(), err.read_text(), seconds, usage.ru_maxrss << 10)


def _template(tmp_path: Path, values: Any, *args: str) -> Run:
    """`slonk chart template -f FILE ARGS`; values are YAML text, or data written as JSON
    (which is YAML)."""
    path = tmp_path / "values.yaml"
    path.write_text(values if isinstance(values, str) else json.dumps(values))
    command = [sys.executable, "-m", "slonk.cli", "chart", "template", "-f", str(path), *args]
    return _measured(command, tmp_path)


def _assert_refused(run: Run, named: str) -> None:
    """Refused, not killed: the command's own error naming the key, quickly, within bounds."""
    assert run.status == 1, (run.status, run.stderr[-2000:])
    assert run.stdout == ""
    assert run.stderr.startswith("slonk: error: "), run.stderr[-2000:]
    assert named in run.stderr, run.stderr[-2000:]
    assert run.seconds < QUICK_SECONDS, run.seconds
    # Refused by the render bound itself: the data bound, and the code it does not count.
    at_bound = "slonk's bound for a render" in named
    assert run.peak_bytes < BOUND + (CODE if at_bound else 0), run.peak_bytes


def _nested(depth: int) -> str:
    return "global:\n  x: " + "[" * depth + "]" * depth + "\n"


def _laughs() -> str:
    """A billion laughs: ten aliases of ten, nine times over."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return "global:\n" + "".join(f"  {line}\n" for line in lines)


def _pools(count: int, replicas: int) -> dict[str, Any]:
    pools = {f"p{i:03d}": {**POOL, "replicas": replicas} for i in range(count)}
    return {"nodepools": {"cpu": None, **pools}, "partitions": {"main": None}}


def _users(count: int) -> list[dict[str, Any]]:
    return [{"name": f"u{i}", "uid": 10000 + i, "gid": 10000} for i in range(count)]


# (case, values, what the error names)
HOSTILE: list[tuple[str, Any, str]] = [
    (
        "issue 28's two lines: the list form, a huge count",
        "nodepools:\n  - {name: cpu, replicas: 100000000}\n",
        "at '/nodepools/0/replicas': maximum",
    ),
    ("the list form, many pools", {"nodepools": [POOL] * 101}, "at '/nodepools': maxItems"),
    (
        "partitions in the list form, many",
        {"partitions": [{"name": "main", "pools": ["cpu"]}] * 101},
        "at '/partitions': maxItems",
    ),
    (
        "a huge count",
        {"nodepools": {"cpu": {"replicas": 100_000_000}}},
        "at '/nodepools/cpu/replicas': maximum",
    ),
    (
        "a count as a string",
        {"nodepools": {"cpu": {"replicas": "100000000"}}},
        "at '/nodepools/cpu/replicas': got string, want integer",
    ),
    (
        "a count beyond any integer",
        {"nodepools": {"cpu": {"replicas": 1e300}}},
        "at '/nodepools/cpu/replicas'",
    ),
    ("too many pools", _pools(101, 1), "at '/nodepools': maxProperties: got 101, want 100"),
    (
        "too many nodes in all (no schema can sum them)",
        _pools(3, 10_000),
        "nodepools: 30000 Slurm nodes in all; at most 20000",
    ),
    ("too many users", {"users": _users(10_001)}, "at '/users': maxItems"),
    (
        "too many development directory users",
        {"ldap": {"dev": {"users": _users(10_001)}}},
        "at '/ldap/dev/users': maxItems",
    ),
    (
        "a partition naming its pools over and over",
        {"partitions": {"main": {"pools": ["cpu"] * 101}}},
        "at '/partitions/main/pools': maxItems",
    ),
    (
        "a string every worker pool repeats",
        {**_pools(100, 1), "images": {"registry": "r" * 1_000_000}},
        "at '/images/registry': maxLength",
    ),
    (
        "a resource list every worker pool repeats",
        {"hooks": {"git": {"resources": {"limits": {f"r{i}": "1" for i in range(10_000)}}}}},
        "at '/hooks/git/resources/limits': maxProperties",
    ),
    (
        "slurm.conf settings beyond Slurm's own",
        {"slurm": {"slurmConf": {f"Key{i}": "1" for i in range(1001)}}},
        "at '/slurm/slurmConf': maxProperties",
    ),
    (
        # Not bounded by the schema (the pods' parser takes any DNS name): the render bound is.
        "a long cluster domain every pool repeats",
        {**_pools(100, 1), "clusterDomain": "a" * 4_000_000},
        f"rendering needs more than {BOUND >> 20} MiB of memory, slonk's bound for a render",
    ),
    ("values nested deeper than slonk reads", _nested(5000), "values nested too deeply"),
    ("values nested deeper than Helm reads", _nested(20_000), "exceeded max depth of 10000"),
    ("a billion laughs", _laughs(), "excessive aliasing"),
]


@pytest.mark.parametrize(("case", "values", "named"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_oversized_or_old_form_values_are_refused_quickly_within_the_bound(
    tmp_path, case, values, named
):
    _assert_refused(_template(tmp_path, values), named)


@pytest.fixture(scope="module")
def unchecked(tmp_path_factory) -> Path:
    """The chart without its schema: what `helm --skip-schema-validation` renders."""
    copy = tmp_path_factory.mktemp("unchecked") / "slonk"
    shutil.copytree(chart.default_chart(), copy)
    (copy / "values.schema.json").unlink()
    return copy


# (case, values, what slonk.boundNodes names) with no schema to refuse them first
UNCHECKED: list[tuple[str, Any, str]] = [
    (
        "issue 28's two lines",
        "nodepools:\n  - {name: cpu, replicas: 100000000}\n",
        "nodepools: a list, the form before chart 0.4.0; write a map keyed by name instead: "
        'nodepools: {"cpu":{"replicas":100000000}}',
    ),
    (
        "the list form of partitions",
        {"partitions": [{"name": "main", "pools": ["cpu"]}]},
        "partitions: a list, the form before chart 0.4.0",
    ),
    (
        "a huge count",
        {"nodepools": {"cpu": {"replicas": 100_000_000}}},
        "nodepools.cpu.replicas: 1e+08 is outside 0..10000",
    ),
    (
        "a count as a string",
        {"nodepools": {"cpu": {"replicas": "100000000"}}},
        "nodepools.cpu.replicas: an integer is wanted, got string",
    ),
    (
        # Helm's parser refuses it first; the guard would too (NaN is in no range).
        "a count that is no number",
        "nodepools:\n  cpu: {replicas: .nan}\n",
        "unsupported value: NaN",
    ),
    ("a negative count", {"nodepools": {"cpu": {"replicas": -1}}}, "is outside 0..10000"),
    ("too many pools", _pools(101, 0), "nodepools: 101 pools; at most 100"),
    ("too many nodes in all", _pools(3, 10_000), "nodepools: 30000 Slurm nodes in all"),
    ("a pool that is text", {"nodepools": {"cpu": "x" * 1000}}, "nodepools.cpu: a map is wanted"),
    ("pools that are text", {"nodepools": "x"}, "nodepools: a map keyed by pool name is wanted"),
]


@pytest.mark.parametrize(("case", "values", "named"), UNCHECKED, ids=[c[0] for c in UNCHECKED])
def test_without_the_schema_no_loop_over_nodes_starts_unbounded(
    tmp_path, unchecked, case, values, named
):
    _assert_refused(_template(tmp_path, values, str(unchecked)), named)


def _scale_values(pools: int, nodes: int) -> dict[str, Any]:
    """bench/render_scale.py's pools (GPUs, features, topology), `nodes` of them in all."""
    base = {
        "cpus": 96,
        "memoryMiB": 1_048_576,
        "gpus": {"count": 8, "type": "h100"},
        "features": ["h100", "rack"],
        "topology": {"switch": "leaf", "block": "block"},
    }
    per_pool, rest = divmod(nodes, pools)
    names = [f"gpu{i:03d}" for i in range(pools)]
    nodepools = {name: {**base, "replicas": per_pool + (i < rest)} for i, name in enumerate(names)}
    partitions = {"main": None, "all": {"pools": names, "default": True}}
    return {"nodepools": {"cpu": None, **nodepools}, "partitions": partitions}


@pytest.mark.parametrize(
    ("pools", "nodes"),
    [(20, 15_000), (100, 20_000)],
    ids=["bench: 15,000 nodes in 20 pools", "the chart's largest: 20,000 nodes in 100 pools"],
)
def test_the_largest_values_the_chart_takes_render_well_within_the_bound(tmp_path, pools, nodes):
    """Measured here: about 110 and 115 MiB at peak, children included; the bound is 512."""
    run = _template(tmp_path, _scale_values(pools, nodes))
    assert run.status == 0, run.stderr[-2000:]
    assert run.stdout.count("\nspec: {clusterIP: None, publishNotReadyAddresses: true") == nodes
    assert run.peak_bytes < BOUND // 2, run.peak_bytes


def test_one_node_beyond_the_largest_is_refused(tmp_path):
    _assert_refused(
        _template(tmp_path, _scale_values(100, 20_001)),
        "nodepools: 20001 Slurm nodes in all; at most 20000",
    )


def test_a_render_that_grows_without_end_is_refused_at_the_bound(tmp_path):
    """The last line of defence, for any chart: a template looping 100,000,000 times (the
    issue's render) fails the render child at RENDER_MEMORY_BYTES, and the command says so."""
    looping = tmp_path / "loop"
    (looping / "templates").mkdir(parents=True)
    (looping / "Chart.yaml").write_text("apiVersion: v2\nname: loop\nversion: 0.1.0\n")
    (looping / "values.yaml").write_text("count: 100000000\n")
    (looping / "templates" / "loop.yaml").write_text(
        "{{- range until (int .Values.count) }}\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x{{ . }}}\n{{- end }}\n"
    )
    command = [sys.executable, "-m", "slonk.cli", "chart", "template", str(looping)]
    run = _measured(command, tmp_path)
    assert run.status == 1, run.stderr[-2000:]
    assert run.stderr == (
        f"slonk: error: rendering needs more than {BOUND >> 20} MiB of memory, slonk's bound "
        "for a render: refused\n"
    )
    assert run.peak_bytes < BOUND + CODE, run.peak_bytes
    assert run.seconds < chart.RENDER_TIMEOUT_SECONDS


LINT = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_DATA, ({bound}, {bound}))
import helm_python
values = json.loads(sys.argv[2])
report = helm_python.lint(sys.argv[1], values, skip_schema_validation=sys.argv[3] == "skip")
print(json.dumps(report["messages"]))
"""


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ("use", "at '/nodepools/0/replicas': maximum"),
        ("skip", "nodepools: a list, the form before chart 0.4.0"),
    ],
)
def test_helm_lint_refuses_issue_28s_values(tmp_path, schema, named):
    """Helm's own path, `helm lint` with and without --skip-schema-validation: refused, in
    a child held to the same bound as ours. Lint turns the chart's `fail` into a log line and
    goes on rendering: the loops over nodes must not run (slonk.boundNodes' `if`)."""
    values = json.dumps({"nodepools": [{"name": "cpu", "replicas": 100_000_000}]})
    code = LINT.format(bound=BOUND)
    run = _measured(
        [sys.executable, "-c", code, str(chart.default_chart()), values, schema], tmp_path
    )
    assert run.status == 0, run.stderr[-2000:]
    assert any(m["severity"] == 3 for m in json.loads(run.stdout)), run.stdout
    assert named in run.stdout + run.stderr
    assert run.seconds < QUICK_SECONDS
    assert run.peak_bytes < BOUND


def test_the_chart_renders_as_many_nodes_as_the_bench():
    assert contract.MAX_NODES >= 15_000  # bench/render_scale.py renders that many


# Every `range` in the templates, and every list `until` makes outside one (services.yaml joins
# a pool's node indices), by file and what it ranges over, and where the schema bounds that (a
# pointer to an array or map carrying maxItems or maxProperties). A new loop fails
# test_every_loop_is_bounded_by_the_schema until its input is bounded and listed here.
ARRAYS_AND_MAPS = {
    ("_helpers.tpl", "."): ["/properties/images/properties/pullSecrets"],
    ("_helpers.tpl", ".value"): ["/properties/nodepools", "/properties/partitions", "walk"],
    ("_helpers.tpl", "ternary $pools dict (empty $error)"): ["/properties/nodepools"],
    ("_helpers.tpl", ".Values.nodepools"): ["/properties/nodepools"],
    ("_helpers.tpl", ".Values.partitions"): ["/properties/partitions"],
    ("_helpers.tpl", ".pools"): ["/$defs/partition/properties/pools"],
    ("_helpers.tpl", ".Values.slurm.slurmConf"): ["/properties/slurm/properties/slurmConf"],
    ("_helpers.tpl", ".Values.slurm.extraLines"): ["/properties/slurm/properties/extraLines"],
    ("_helpers.tpl", ".settings"): ["/$defs/confMap"],
    ("_helpers.tpl", "$lists"): ["literal"],  # at most workers, controller and login
    ("_helpers.tpl", ".Values.ldap.uris"): ["/properties/ldap/properties/uris"],
    ("_helpers.tpl", "$owners"): ["literal"],
    ("_helpers.tpl", "$labels"): ["/$defs/labels"],
    ("_helpers.tpl", "$sysctls"): ["/$defs/podSecurityContext/properties/sysctls"],
    ("_accounts.tpl", ".groups"): [
        "/properties/groups",
        "/properties/ldap/properties/dev/properties/groups",
    ],
    ("_accounts.tpl", ".users"): [
        "/properties/users",
        "/properties/ldap/properties/dev/properties/users",
    ],
    ("_accounts.tpl", "($user.groups | default list)"): ["/$defs/user/properties/groups"],
    ("_accounts.tpl", ".Values.accounting.groupAccounts"): [
        "/properties/accounting/properties/groupAccounts"
    ],
    ("services.yaml", ".Values.nodepools"): ["/properties/nodepools"],
    ("services.yaml", "until $replicas"): ["boundNodes"],
    ("workers.yaml", ".Values.nodepools"): ["/properties/nodepools"],
    ("workers.yaml", ".Values.slurm.slurmConf"): ["/properties/slurm/properties/slurmConf"],
    ("rbac.yaml", ".Values.nodepools"): ["/properties/nodepools"],
    ("NOTES.txt", ".Values.nodepools"): ["/properties/nodepools"],
    ("networkpolicy.yaml", "."): [
        "/properties/networkPolicy/properties/workers/properties/egressExcept"
    ],
    ("networkpolicy.yaml", 'include "slonk.ldapPorts" . | fromJsonArray'): [
        "/properties/ldap/properties/uris"
    ],
}
# Templates that make objects per pool or per node: their loops run only if slonk.boundNodes.
NODE_TEMPLATES = ("services.yaml", "workers.yaml")
_RANGE = re.compile(r"\{\{-?\s*range\s+(?:\$\w+(?:\s*,\s*\$\w+)?\s*:=\s*)?(.*?)\s*-?\}\}")
_UNTIL = re.compile(r"\{\{-?(?!\s*range\b)[^}]*?\b((?:until|untilStep|seq)\s+(?:\$\w+|\([^)]*\)))")


def _loops() -> list[tuple[str, str]]:
    found = []
    for template in sorted((chart.default_chart() / "templates").iterdir()):
        text = template.read_text()
        for expression in _RANGE.findall(text) + _UNTIL.findall(text):
            if not expression.startswith("list "):  # a literal list in the template
                found.append((template.name, expression))
    return found


def _schema_at(schema: dict[str, Any], pointer: str) -> dict[str, Any]:
    node: Any = schema
    for key in pointer.strip("/").split("/"):
        node = node[key]
    while "$ref" in node:
        node = _schema_at(schema, node["$ref"].removeprefix("#"))
    return node


def test_every_loop_is_bounded_by_the_schema():
    schema = json.loads((chart.default_chart() / "values.schema.json").read_text())
    loops = _loops()
    assert {loop for loop in loops} == set(ARRAYS_AND_MAPS), "a loop is added or gone: list it"
    for loop, inputs in ARRAYS_AND_MAPS.items():
        for pointer in (p for p in inputs if p.startswith("/")):
            bounds = _schema_at(schema, pointer)
            assert "maxItems" in bounds or "maxProperties" in bounds, (loop, pointer)


@pytest.mark.parametrize("template", NODE_TEMPLATES)
def test_the_node_templates_bound_the_nodes_before_any_loop(template):
    text = (chart.default_chart() / "templates" / template).read_text()
    # Inside its `if`: `helm lint` does not stop at a `fail`.
    assert text.index('{{- if include "slonk.boundNodes" . }}') < text.index("range ")


def test_a_values_file_that_is_no_yaml_is_named(tmp_path):
    run = _template(tmp_path, "nodepools: {cpu: [\n")
    _assert_refused(run, f"{tmp_path / 'values.yaml'}: ")


def test_the_values_sets_still_render_through_the_bounded_child(tmp_path):
    """The bounded command prints what the render prints in-process (secrets aside, which
    are generated per render)."""
    files = [VALUES / "gpu-pools.yaml", VALUES / "metrics.yaml"]
    args = [arg for f in files for arg in ("-f", str(f))]
    run = _measured([sys.executable, "-m", "slonk.cli", "chart", "template", *args], tmp_path)
    assert run.status == 0, run.stderr
    rendered = chart.manifest(chart.render(chart.default_chart(), chart.user_values(files)))

    def kinds_and_names(text: str) -> list[tuple[str, str]]:
        docs = [d for d in yaml.safe_load_all(text) if d]
        return [(d["kind"], d["metadata"]["name"]) for d in docs]

    assert kinds_and_names(run.stdout) == kinds_and_names(rendered)


def test_the_render_child_runs_no_module_from_the_working_directory(tmp_path):
    """The child is a new Python: a json.py where `slonk` is run must not be imported."""
    (tmp_path / "json.py").write_text("raise SystemExit('json.py from the working directory ran')")
    slonk = Path(sys.executable).parent / "slonk"  # the console script, as people run it
    done = subprocess.run(
        [str(slonk), "chart", "template"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "ran" not in done.stderr
