"""Labels and annotations as the API server validates them (apimachinery's ValidateLabels and
ValidateAnnotations): a key is an optional DNS subdomain prefix of at most 253 characters and
`/`, then a name of at most 63; a label's value is at most 63 characters of the same kind, or
empty; all annotations of an object together hold at most 256 KiB."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from slonk.local.apiserver.status import invalid

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME_MAX, PREFIX_MAX = 63, 253
ANNOTATIONS_MAX_BYTES = 256 * 1024
_NAME_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)


def _key_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "prefix part must be non-empty"
    if prefix and (len(prefix) > PREFIX_MAX or not _PREFIX.fullmatch(prefix)):
        return f"prefix part must be a lowercase DNS subdomain of at most {PREFIX_MAX} characters"
    if not name or len(name) > NAME_MAX:
        return f"name part must be no more than {NAME_MAX} characters and not empty"
    if not _NAME.fullmatch(name):
        return f"name part {_NAME_RULE}"
    return None


def check(kind: str, meta: Mapping[str, Any]) -> None:
    """Raises the API server's 422 for the first key or value it would refuse."""
    name = str(meta.get("name", ""))
    for field in ("labels", "annotations"):
        values = meta.get(field) or {}
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise invalid(kind, name, f"metadata.{field}", "strings only")
        for key, value in values.items():
            problem = _key_problem(key)
            if problem:
                raise invalid(kind, name, f"metadata.{field}", f"Invalid value: {key!r}: {problem}")
            if (
                field == "labels"
                and value
                and (len(value) > NAME_MAX or not _NAME.fullmatch(value))
            ):
                raise invalid(
                    kind,
                    name,
                    "metadata.labels",
                    f"Invalid value: {value!r}: a label value must be {NAME_MAX} characters or "
                    f"fewer, and {_NAME_RULE}",
                )
    size = sum(len(k) + len(v) for k, v in (meta.get("annotations") or {}).items())
    if size > ANNOTATIONS_MAX_BYTES:
        raise invalid(
            kind,
            name,
            "metadata.annotations",
            f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes",
        )
