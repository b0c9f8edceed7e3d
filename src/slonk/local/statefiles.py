"""A local cluster's state files as read back: the record of its pods (cluster.json), the
values in force (values.yaml) and each pod's template (pod.json). Only root writes them, but
a crash, a full disk or a careless edit can leave one empty, corrupt or out of step with the
pods that run; read as if whole, such a file acts on the wrong pods (a record listing fewer
pods made the fake API server report a live pod gone, and its node was drained) or drops
what is in force (an empty values.yaml made `upgrade` succeed without any earlier value).
So each is checked as it is read, and a bad one stops the command (StateFileError, naming
the file and what is wrong) before it acts on anything.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from slonk.config import patterns
from slonk.config.accounts import show
from slonk.config.spec import DNS_LABEL_MAX
from slonk.local.manifests import LocalModeError

RUNTIMES = ("host", "podman")
# A dotted quad, as local mode gives pods (ipaddress is 20 times slower: the record is read
# at every step of a 1000-pod cluster's `up`).
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = re.compile(rf"{_OCTET}(\.{_OCTET}){{3}}")
_DNS_LABEL = re.compile(patterns.DNS_LABEL)
# The record's other keys, each optional (records from before it had them), by type.
RECORD_FLAGS = {"prefix": str, "made_netns_mount": bool, "prometheus": bool}
RECORD_HINT = "move it aside and `slonk local down` stops whatever this cluster runs"
VALUES_HINT = "put back the values in force (`up`'s -f files, then each upgrade's), or `down`, `up`"
POD_SPEC_HINT = "`slonk local down` and `up` make it again"


class StateFileError(LocalModeError):
    """A state file slonk would not have written: the command stops, having done nothing."""

    def __init__(self, path: Path, problem: str, hint: str) -> None:
        super().__init__(f"{path}: {problem}; nothing done ({hint})")


def _read(path: Path, hint: str) -> str:
    """The file's text; FileNotFoundError is the caller's to word."""
    try:
        return path.read_bytes().decode()
    except FileNotFoundError:
        raise
    except OSError as err:
        raise StateFileError(path, f"cannot be read: {err.strerror}", hint) from None
    except UnicodeDecodeError:
        raise StateFileError(path, "not UTF-8 text", hint) from None


def _read_present(path: Path, hint: str) -> str:
    try:
        return _read(path, hint)
    except FileNotFoundError:
        raise StateFileError(path, "missing", hint) from None


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _json_object(path: Path, text: str, hint: str) -> dict[str, Any]:
    if not text.strip():
        raise StateFileError(path, "empty", hint)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise StateFileError(path, f"not valid JSON ({err})", hint) from None
    if not isinstance(data, dict):
        raise StateFileError(path, f"expected a JSON object, got {_kind(data)}", hint)
    return data


def is_pod_name(value: object) -> bool:
    """A pod's name as local mode makes one: a DNS-1123 label (it names a directory, a
    network namespace and a Slurm node)."""
    return (
        isinstance(value, str)
        and len(value) <= DNS_LABEL_MAX
        and _DNS_LABEL.fullmatch(value) is not None
    )


def _pod_entry(path: Path, name: object, entry: object) -> str:
    """A record's pod: its address, refused unless name, role and address have their shape."""
    if not is_pod_name(name):
        raise StateFileError(
            path, f"pods.{show(name)}: not a pod name (a DNS-1123 label)", RECORD_HINT
        )
    if not isinstance(entry, dict):
        raise StateFileError(
            path, f"pods.{name}: expected an object, got {_kind(entry)}", RECORD_HINT
        )
    role, address = entry.get("role"), entry.get("address")
    if not isinstance(role, str) or not role:
        raise StateFileError(
            path, f"pods.{name}.role: expected a role, got {show(role)}", RECORD_HINT
        )
    if not isinstance(address, str) or not IPV4.fullmatch(address):
        raise StateFileError(
            path, f"pods.{name}.address: expected an IPv4 address, got {show(address)}", RECORD_HINT
        )
    return address


def _unlisted_templates(pods_dir: Path, listed: Collection[str]) -> list[str]:
    """Pods with a template (pod.json: each was started, and may run) the record omits."""
    try:
        folders = [f.name for f in os.scandir(pods_dir) if f.name not in listed]
    except FileNotFoundError:
        return []
    return sorted(name for name in folders if (pods_dir / name / "pod.json").exists())


def load_record(path: Path, pods_dir: Path) -> dict[str, Any]:
    """cluster.json's record (FileNotFoundError: none), refused unless whole and in step
    with the pods there are: one controller (two with a backup), an address per pod, and
    every pod with a template in `pods_dir` listed (`up` and `upgrade` write a pod's entry
    before its directory, and remove it after)."""
    record = _json_object(path, _read(path, RECORD_HINT), RECORD_HINT)
    pods = record.get("pods")
    if not isinstance(pods, dict) or not pods:
        raise StateFileError(path, f"pods: expected the pods, got {show(pods)}", RECORD_HINT)
    addresses = [_pod_entry(path, name, entry) for name, entry in pods.items()]
    if len(set(addresses)) != len(addresses):
        raise StateFileError(path, "pods: two pods share an address", RECORD_HINT)
    controllers = [name for name, pod in pods.items() if pod["role"] == "controller"]
    if len(controllers) not in (1, 2):  # a primary, and perhaps its backup
        raise StateFileError(
            path, f"pods: {len(controllers)} controllers listed, expected 1 or 2", RECORD_HINT
        )
    unlisted = _unlisted_templates(pods_dir, pods)
    if unlisted:
        raise StateFileError(
            path,
            f"lists {len(pods)} pods but not {', '.join(map(show, unlisted))}, which "
            f"{'has' if len(unlisted) == 1 else 'have'} a pod directory: a live pod would be "
            "taken for gone",
            RECORD_HINT,
        )
    for key, kind in RECORD_FLAGS.items():
        if key in record and not isinstance(record[key], kind):
            raise StateFileError(path, f"{key}: got {show(record[key])}", RECORD_HINT)
    if record.get("runtime", "host") not in RUNTIMES:
        runtime = show(record["runtime"])
        raise StateFileError(path, f"runtime: got {runtime}, expected host or podman", RECORD_HINT)
    return record


def load_values(path: Path) -> dict[str, Any]:
    """values.yaml, the values in force: a mapping, maybe `{}` (an `up` without -f), as
    local mode writes it. An empty file is no set of values: read as one, every earlier
    value (static users, hooks, the SSH CA) would be dropped."""
    text = _read_present(path, VALUES_HINT)
    if not text.strip():
        raise StateFileError(path, "empty: the values in force are lost", VALUES_HINT)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise StateFileError(path, f"not valid YAML{line}", VALUES_HINT) from None
    if not isinstance(data, dict):
        raise StateFileError(path, f"expected a mapping of values, got {_kind(data)}", VALUES_HINT)
    return data


def _strings(path: Path, spec: dict[str, Any], key: str, *, mapping: bool) -> None:
    value = spec.get(key)
    items = list(value.items()) if mapping and isinstance(value, dict) else None
    if not mapping and isinstance(value, list):
        items = [("", v) for v in value]
    if items is None or not all(isinstance(k, str) and isinstance(v, str) for k, v in items):
        kind = "a mapping of strings" if mapping else "a list of strings"
        raise StateFileError(path, f"{key}: expected {kind}", POD_SPEC_HINT)


def load_pod_spec(path: Path, name: str) -> dict[str, Any]:
    """A pod's pod.json, refused unless it is this pod's (its hostname) and what is read
    from it has its type: env (handed to `env` on the command line), files, command."""
    spec = _json_object(path, _read_present(path, POD_SPEC_HINT), POD_SPEC_HINT)
    if spec.get("hostname") != name:
        got = show(spec.get("hostname"))
        raise StateFileError(path, f"hostname: {got}, not the pod's name {name}", POD_SPEC_HINT)
    _strings(path, spec, "env", mapping=True)
    _strings(path, spec, "files", mapping=True)
    _strings(path, spec, "command", mapping=False)
    # A variable's name ends at its first `=` and `env` reads a leading `-` as its option.
    bad = [key for key in spec["env"] if not key or "=" in key or key.startswith("-")]
    if bad:
        raise StateFileError(path, f"env: {show(bad[0])} is no variable name", POD_SPEC_HINT)
    return spec
