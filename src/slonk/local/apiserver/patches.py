"""The three patch types: JSON merge patch (RFC 7386), Kubernetes' strategic merge patch
(merge semantics, lists with a merge key merged by it) and JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

from slonk.local.apiserver.status import ApiError

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"

# Lists the API merges by a key in a strategic patch (the patchMergeKey of the Go types
# the fake serves); other lists are replaced. A key of None: a list of scalars merged as a set.
MERGE_KEYS: dict[str, str | None] = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "addresses": "type",
    "finalizers": None,
}


def apply(kind: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    """`target` patched (a new object); 415 for a patch type the fake does not take, 400 or
    422 for a patch that does not apply."""
    if kind == MERGE:
        if not isinstance(patch, dict):
            raise ApiError(400, "a merge patch must be a JSON object")
        return _merge(target, patch)
    if kind == STRATEGIC:
        if not isinstance(patch, dict):
            raise ApiError(400, "a strategic merge patch must be a JSON object")
        return _strategic(target, patch)
    if kind == JSON_PATCH:
        return _json_patch(target, patch)
    raise ApiError(
        415,
        f"the fake API server does not take patches of type {kind!a} "
        f"(it takes {MERGE}, {STRATEGIC} and {JSON_PATCH})",
    )


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _strategic(target: Any, patch: dict[str, Any]) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.partition("/")[2]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _strategic(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key], key)
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str | None, field: str) -> list[Any]:
    if key is None:
        return current + [v for v in patch if v not in current]
    result = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(400, f"{field}: every item of a strategic merge patch needs {key!r}")
        at = next((i for i, old in enumerate(result) if old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
        elif at is None:
            result.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            result[at] = _strategic(result[at], item)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(400, f"JSON patch path {path!a} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, steps: list[str], path: str) -> tuple[Any, str]:
    for step in steps[:-1]:
        doc = _child(doc, step, path)
    return doc, steps[-1]


def _child(doc: Any, step: str, path: str) -> Any:
    try:
        return doc[int(step)] if isinstance(doc, list) else doc[step]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, f"JSON patch: no {path!a} in the object") from None


def _json_patch(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    if not isinstance(operations, list):
        raise ApiError(400, "a JSON patch must be a list of operations")
    doc: Any = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or op.get("op") not in (
            "add",
            "remove",
            "replace",
            "move",
            "copy",
            "test",
        ):
            raise ApiError(400, f"JSON patch: bad operation {op!a}")
        path = op.get("path", "")
        if not isinstance(path, str):
            raise ApiError(400, "JSON patch: path must be a string")
        if op["op"] == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, f"JSON patch: test of {path!a} failed")
            continue
        if op["op"] in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if op["op"] == "move":
                doc = _remove(doc, op["from"])
        elif op["op"] != "remove":
            if "value" not in op:
                raise ApiError(400, f"JSON patch: {op['op']} of {path!a} has no value")
            value = copy.deepcopy(op["value"])
        if op["op"] == "remove":
            doc = _remove(doc, path)
        elif op["op"] == "replace":
            _get(doc, path)  # it must exist
            doc = _set(doc, path, value, replace=True)
        else:
            doc = _set(doc, path, value, replace=False)
    if not isinstance(doc, dict):
        raise ApiError(422, "JSON patch: the result is no object")
    return doc


def _get(doc: Any, path: str) -> Any:
    for step in _pointer(path):
        doc = _child(doc, step, path)
    return doc


def _remove(doc: Any, path: str) -> Any:
    steps = _pointer(path)
    if not steps:
        raise ApiError(422, "JSON patch: cannot remove the whole object")
    parent, last = _parent(doc, steps, path)
    _child(parent, last, path)
    if isinstance(parent, list):
        del parent[int(last)]
    else:
        del parent[last]
    return doc


def _set(doc: Any, path: str, value: Any, replace: bool) -> Any:
    steps = _pointer(path)
    if not steps:
        return value
    parent, last = _parent(doc, steps, path)
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
            return doc
        try:
            index = int(last)
        except ValueError:
            raise ApiError(422, f"JSON patch: {path!a} is no list index") from None
        if not 0 <= index <= len(parent) - (1 if replace else 0):
            raise ApiError(422, f"JSON patch: {path!a} is out of range")
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError(422, f"JSON patch: {path!a} lies in no object or list")
    return doc
