"""The chart's copy of the cluster contract, written from the model.

Each ruled field of `slonk.config.model` (made with `setting` or `required`), each health
check's timeout and integer options (`slonk.config.health_checks`) and each active check's
timeout and spread (`slonk.config.active_checks`) is one setting: one values
key, its type, its bounds or pattern, its default, perhaps its documentation. This module
writes them where the chart states them: the setting's node of values.schema.json (so Helm
refuses a value before any template runs), its default (and a documented one's comment) in
values.yaml, and the lists the templates check beside the schema (templates/_contract.tpl).
Everything else in those files is the chart's own and is left as it is.

    python -m slonk.config.contract [CHART]          write the files
    python -m slonk.config.contract --check [CHART]  fail, naming each file and key, if a
                                                     file is not what would be written (ci/lint)
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import yaml

from slonk.base.errors import SlonkError
from slonk.config import model, spec
from slonk.config.active_checks import ACTIVE_CHECKS, ACTIVE_TIMEOUT, NODE, SPAN, SPREAD
from slonk.config.health_checks import CHECK_TIMEOUT, HEALTH_CHECKS, option_rule
from slonk.config.model import Rule, default_of, rules
from slonk.config.trends import MAX_INCREASE, TRENDS, WINDOW

# Where each model class's keys sit in values.yaml ("*": any key of a map). A class whose
# keys are spread over values ("") names each key's path in its Rule (`values`).
SECTIONS: dict[type, str] = {
    model.ClusterSpec: "",
    model.NodePool: "nodepools.*",
    model.Gpus: "nodepools.*.gpus",
    model.Placement: "nodepools.*.topology",
    model.Partition: "partitions.*",
    model.LdapSettings: "ldap",
    model.HookSettings: "hooks",
    model.HealthSettings: "health",
    model.RecycleSettings: "health.recycle",
    model.ActiveSettings: "health.active",
    model.TrendSettings: "health.trends",
    model.SyncerSettings: "syncer",
    model.MetricsSettings: "metrics",
    model.RestApiSettings: "restapi",
    model.MailSettings: "mail",
    model.BackupController: "controller.backup",
    model.CapacitySettings: "capacity",
    model.Priority: "slurm.priority",
    model.PriorityWeights: "slurm.priority.weights",
    model.SshSettings: "",
    model.Database: "accounting.database",
    model.AccountingSettings: "",
}
# The chart's own bounds on what it renders: pools, and Slurm nodes in all (each a pod and a
# Service); a pool's replicas are NodePool's. 20,000 nodes: bench/render_scale.py's 15,000
# with a third more; in 100 pools they render in about 115 MiB (test_render_bounds.py).
MAX_POOLS = 100
MAX_NODES = 20000

SCHEMA = "values.schema.json"
VALUES = "values.yaml"
TEMPLATES = "templates/_contract.tpl"
_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}
# What a setting's schema node says that the setting's rule owns; any other key of the node
# (a description) is the chart's.
_OWNED = {
    *("type", "enum", "minimum", "maximum", "exclusiveMinimum", "pattern", "default"),
    *("$ref", "anyOf"),
}
_DOC_WIDTH = 96


class ContractError(SlonkError):
    """The model and the chart's files cannot be brought together (a path missing)."""


@dataclass(frozen=True)
class Setting:
    values: str  # its dotted path in values.yaml; "*" for any key of a map
    rule: Rule
    default: Any  # MISSING: required

    def schema(self) -> dict[str, Any]:
        """The setting's node of values.schema.json."""
        rule, node = self.rule, dict[str, Any]()
        if rule.choices:
            node["enum"] = list(rule.choices)
        else:
            kinds = [_TYPES[rule.kind], *(["integer"] if rule.numbers else [])]
            kinds += ["null"] if rule.nullable else []
            node["type"] = kinds if len(kinds) > 1 else kinds[0]
        for key, bound in (
            ("exclusiveMinimum", rule.above),
            ("minimum", rule.minimum),
            ("maximum", rule.maximum),
        ):
            if bound is not None:
                node[key] = bound
        if rule.pattern is not None:
            node["pattern"] = rule.pattern
        if self.default is not MISSING and self.default is not None:
            node["default"] = self.default
        if rule.doc:
            node["description"] = rule.doc
        return node


def settings() -> Iterator[Setting]:
    """Every setting the model rules, with its values path."""
    for cls, section in SECTIONS.items():
        for name, rule in rules(cls).items():
            if rule.values is None and not section:
                raise ContractError(f"{cls.__name__}.{name}: no values path (Rule.values)")
            path = rule.values or f"{section}.{rule.key}"
            try:
                default = default_of(cls, name)
            except LookupError:
                default = MISSING
            yield Setting(path, rule, default)
    for check, defaults in HEALTH_CHECKS.items():
        at = f"health.checks.{check}"
        yield Setting(f"{at}.{CHECK_TIMEOUT.key}", CHECK_TIMEOUT, defaults.timeout_seconds)
        for key, value in defaults.options.items():
            if isinstance(value, int) and not isinstance(value, bool):
                yield Setting(f"{at}.{key}", option_rule(key, value), value)
    for check, active in ACTIVE_CHECKS.items():
        at = f"health.active.checks.{check}"
        yield Setting(f"{at}.{ACTIVE_TIMEOUT.key}", ACTIVE_TIMEOUT, active.timeout_seconds)
        yield Setting(f"{at}.{SPREAD.key}", SPREAD, active.options[SPREAD.key])
    yield Setting(f"health.active.commands.*.{ACTIVE_TIMEOUT.key}", ACTIVE_TIMEOUT, MISSING)
    yield Setting(f"health.active.commands.*.{SPAN.key}", SPAN, NODE)
    for name, trend in TRENDS.items():
        at = f"health.trends.rules.{name}"
        yield Setting(f"{at}.{MAX_INCREASE.key}", MAX_INCREASE, trend.max_increase)
        yield Setting(f"{at}.{WINDOW.key}", WINDOW, trend.window_seconds)


# values.schema.json


def _schema_child(schema: dict[str, Any], node: dict[str, Any], key: str) -> dict[str, Any]:
    """The node under `key` ("*": a map's items), following a $ref into $defs."""
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    child = node.get("additionalProperties") if key == "*" else node.get("properties", {}).get(key)
    if not isinstance(child, dict):
        raise ContractError(f"{SCHEMA}: no node for {key!r}")
    return child


def write_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with every setting's node made from its rule."""
    for setting in settings():
        *parents, last = setting.values.split(".")
        node = schema
        try:
            for key in parents:
                node = _schema_child(schema, node, key)
        except ContractError as err:
            raise ContractError(f"{setting.values}: {err}") from None
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        # A new setting's node is made; an existing one keeps what its rule does not own.
        owned = _OWNED | ({"description"} if setting.rule.doc else set())
        old = node.setdefault("properties", {}).get(last, {})
        kept = {k: v for k, v in old.items() if k not in owned}
        node["properties"][last] = {**setting.schema(), **kept}
    # The chart's bounds on pools, in either form (a list is refused only by a template).
    pools = schema["properties"]["nodepools"]
    pools["maxProperties"] = pools["maxItems"] = MAX_POOLS
    replicas = _schema_child(schema, _schema_child(schema, pools, "*"), "replicas")
    pools["items"]["properties"]["replicas"] = {
        k: v for k, v in replicas.items() if k in ("type", "minimum", "maximum")
    }
    return schema


def format_schema(value: Any, indent: int = 0, key: str | None = None) -> str:
    """JSON as the chart writes its schema: each map of schemas one per line, every schema
    that fits (or has no schema inside) on one line."""
    compact = json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    if not isinstance(value, dict) or not value:
        return compact
    nested = any(isinstance(v, dict) for v in value.values())
    if not (
        key in ("properties", "$defs")
        or "properties" in value
        or "$defs" in value
        or (nested and indent + len(compact) > 96)
    ):
        return compact
    pad = " " * (indent + 2)
    lines = [f"{pad}{json.dumps(k)}: {format_schema(v, indent + 2, k)}" for k, v in value.items()]
    return "{\n" + ",\n".join(lines) + "\n" + " " * indent + "}"


# values.yaml

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_-]+):(?P<value>.*)$")


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()


def _comment(indent: str, doc: str) -> list[str]:
    """A key's `# --` comment (helm-docs' form) in lines of at most _DOC_WIDTH."""
    lines = textwrap.wrap(doc, _DOC_WIDTH - len(indent) - len("# -- "), break_on_hyphens=False)
    return [f"{indent}# {'-- ' if i == 0 else ''}{line}" for i, line in enumerate(lines)]


def write_values(text: str) -> str:
    """values.yaml with each setting it shows holding the setting's default (and its `doc` as
    its comment, where the rule has one), and each documented setting it lacks added at the
    end of its section. Any other line is the chart's."""
    shown = {
        s.values: s
        for s in settings()
        if "*" not in s.values and s.default is not MISSING and s.default is not None
    }
    lines, seen = text.split("\n"), set()
    # Each key line: its dotted path, its indentation and its index.
    keys: list[tuple[str, int, int]] = []
    path: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        match = _KEY_LINE.match(line)
        if not match:
            continue
        depth = len(match["indent"])
        while path and path[-1][0] >= depth:
            path.pop()
        path.append((depth, match["key"]))
        keys.append((".".join(key for _, key in path), depth, i))
    edits: dict[int, list[str]] = {}  # a line's index -> what replaces it
    for dotted, depth, i in keys:
        setting = shown.get(dotted)
        value = _KEY_LINE.match(lines[i])["value"].strip()  # type: ignore[index]
        if setting is None or not value or value.startswith("#"):
            continue
        seen.add(dotted)
        indent = " " * depth
        kept = re.search(r"\s+#.*$", lines[i])  # the chart's own comment on the line
        comment = kept.group() if kept else ""
        written = f"{dotted.rsplit('.', 1)[-1]}: {_yaml_scalar(setting.default)}{comment}"
        edits[i] = [f"{indent}{written}"]
        if setting.rule.doc:
            above = i
            while above > 0 and lines[above - 1].startswith(f"{indent}#"):
                above -= 1
                edits[above] = []
            edits[i] = _comment(indent, setting.rule.doc) + edits[i]
    for dotted, setting in shown.items():
        parent, _, key = dotted.rpartition(".")
        if dotted in seen or not setting.rule.doc:
            continue
        found = [(depth, i) for at, depth, i in keys if at == parent]
        if not found:
            raise ContractError(f"{VALUES}: no section {parent!r} for {dotted}")
        depth, i = found[0]
        end = i
        for j in range(i + 1, len(lines)):
            stripped = lines[j].strip()
            if stripped and len(lines[j]) - len(lines[j].lstrip()) <= depth:
                break
            if stripped:
                end = j
        indent = " " * (depth + 2)
        added = _comment(indent, setting.rule.doc)
        added.append(f"{indent}{key}: {_yaml_scalar(setting.default)}")
        edits[end] = [*edits.get(end, [lines[end]]), *added]
    out: list[str] = []
    for i, line in enumerate(lines):
        out.extend(edits.get(i, [line]))
    return "\n".join(out)


# templates/_contract.tpl


def _define(name: str, why: str, body: str) -> str:
    return f'{{{{- /* {why} */}}}}\n{{{{- define "{name}" -}}}}\n{body}\n{{{{- end }}}}\n'


def write_templates() -> str:
    replicas = model.rule_of(model.NodePool, "replicas").maximum
    bounds = {"pools": MAX_POOLS, "replicas": int(replicas or 0), "nodes": MAX_NODES}
    return "".join(
        [
            "{{- /* Written by `python -m slonk.config.contract` from slonk.config: edit that."
            " */}}\n",
            _define(
                "slonk.scaleBounds",
                "How many node pools, replicas in a pool and Slurm nodes in all the chart renders.",
                json.dumps(bounds, separators=(", ", ": ")),
            ),
            _define(
                "slonk.managedSlurmKeys",
                "Settings slonk derives from the spec, with Slurm's aliases, lower case "
                "(Slurm reads keys in any case): spec.MANAGED_KEYS.",
                " ".join(sorted(k.lower() for k in spec.MANAGED_KEYS)),
            ),
            _define(
                "slonk.reservedPoolNames",
                "Pool names whose StatefulSet or node names would be another component's, "
                "and Slurm's keyword for defaults: spec.RESERVED_POOL_NAMES.",
                " ".join(spec.RESERVED_POOL_NAMES),
            ),
            _define(
                "slonk.partitionKeys",
                "What slonk writes on a partition's line: spec.PARTITION_KEYS.",
                " ".join(sorted(k.lower() for k in spec.PARTITION_KEYS)),
            ),
        ]
    )


def expected(chart: Path) -> dict[str, str]:
    """Each generated file of `chart` as it should be."""
    schema = write_schema(json.loads((chart / SCHEMA).read_text()))
    return {
        SCHEMA: format_schema(schema) + "\n",
        VALUES: write_values((chart / VALUES).read_text()),
        TEMPLATES: write_templates(),
    }


def stale(chart: Path) -> dict[str, str]:
    """A unified diff for each generated file of `chart` that is not current."""
    found = {}
    for name, content in expected(chart).items():
        path = chart / name
        current = path.read_text() if path.exists() else ""
        if current != content:
            diff = difflib.unified_diff(
                current.splitlines(),
                content.splitlines(),
                name,
                f"{name} (from slonk.config)",
                lineterm="",
            )
            found[name] = "\n".join(diff)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slonk.config.contract")
    parser.add_argument("--check", action="store_true", help="fail if a file is not current")
    parser.add_argument("chart", nargs="?", type=Path, default=Path("charts/slonk"))
    args = parser.parse_args(argv)
    if args.check:
        found = stale(args.chart)
        for diff in found.values():
            print(diff)
        if found:
            print(
                f"contract: {', '.join(found)} differ from slonk.config (the home of every "
                "setting's type, bounds and default): change the model, then run "
                "`python -m slonk.config.contract`",
                file=sys.stderr,
            )
        return 1 if found else 0
    for name, content in expected(args.chart).items():
        (args.chart / name).write_text(content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
