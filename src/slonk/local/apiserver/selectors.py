"""Label selectors (equality and set-based) and the field selectors the fake supports."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from slonk.local.apiserver.status import ApiError

Match = Callable[[Mapping[str, Any]], bool]
# One requirement: `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a)`.
_REQUIREMENT = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<absent>[^\s,!=()]+)"
    r"|(?P<key>[^\s,!=()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,!=()]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\)|))\s*(?:,|$)"
)
FIELDS: dict[str, tuple[str, ...]] = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "status.phase": ("status", "phase"),
    "spec.unschedulable": ("spec", "unschedulable"),
    "involvedObject.name": ("involvedObject", "name"),
    "involvedObject.kind": ("involvedObject", "kind"),
    # `kubectl describe node` asks for these too (a Node's: namespace "", uid its name)
    "involvedObject.namespace": ("involvedObject", "namespace"),
    "involvedObject.uid": ("involvedObject", "uid"),
    # events.k8s.io/v1's name for it: the store keeps Events in core v1's form
    "regarding.name": ("involvedObject", "name"),
}


def labels(selector: str) -> Match:
    """A labelSelector as a test of an object's labels; 400 for one that does not parse."""
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    position = 0
    text = selector.strip()
    while position < len(text):
        found = _REQUIREMENT.match(text, position)
        if found is None or found.end() == position:
            raise ApiError(400, f"unable to parse requirement: invalid label selector {selector!a}")
        position = found.end()
        tests.append(_requirement(found))
    return lambda obj: all(t(obj.get("metadata", {}).get("labels") or {}) for t in tests)


def _requirement(found: re.Match[str]) -> Callable[[Mapping[str, str]], bool]:
    if found["absent"]:
        absent = found["absent"]
        return lambda got: absent not in got
    key, op = found["key"], found["op"]
    if op in ("=", "=="):
        value = found["value"]
        return lambda got: got.get(key) == value
    if op == "!=":
        value = found["value"]
        return lambda got: got.get(key) != value
    if found["set"]:
        values = {v.strip() for v in found["values"].split(",") if v.strip()}
        inside = found["set"] == "in"
        return lambda got: (got.get(key) in values) == inside
    return lambda got: key in got


def flag(value: str | None) -> bool:
    """A boolean query parameter as the API reads it (Go's ParseBool): older Python clients
    send `watch=True`, newer ones `watch=true`, kubectl `watch=1`."""
    return value in ("1", "t", "T", "true", "True", "TRUE")


def fields(selector: str) -> Match:
    """A fieldSelector (`a=b`, `a==b`, `a!=b`, comma-joined) over the fields in FIELDS."""
    tests: list[Match] = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        pieces = re.split(r"(!=|==|=)", part, maxsplit=1)
        if len(pieces) != 3:
            raise ApiError(400, f"invalid field selector {selector!a}: {part!a} has no operator")
        key, op, value = pieces[0].strip(), pieces[1], pieces[2]
        if key not in FIELDS:
            raise ApiError(400, f'"{key}" is not a known field selector: only {", ".join(FIELDS)}')

        def test(
            obj: Mapping[str, Any],
            path: tuple[str, ...] = FIELDS[key],
            op: str = op,
            want: str = value.strip(),
        ) -> bool:
            got: Any = obj
            for step in path:
                got = got.get(step) if isinstance(got, Mapping) else None
            text = "" if got is None else str(got).lower() if isinstance(got, bool) else str(got)
            return (text == want) != (op == "!=")

        tests.append(test)
    return lambda obj: all(t(obj) for t in tests)


def selector(label_selector: Mapping[str, Any]) -> Match:
    """A LabelSelector object (matchLabels, matchExpressions) as a test, for PDBs and
    StatefulSets."""
    parts = [f"{k}={v}" for k, v in (label_selector.get("matchLabels") or {}).items()]
    for expression in label_selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values", [])
        parts.append(
            {
                "In": f"{key} in ({','.join(values)})",
                "NotIn": f"{key} notin ({','.join(values)})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[op]
        )
    return labels(",".join(parts))
