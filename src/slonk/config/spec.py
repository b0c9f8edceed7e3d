"""The normalized cluster spec (`cluster.yaml`): what the chart writes and every pod reads.

The chart turns Helm values into this document; `load_spec` turns it into frozen
dataclasses and refuses anything inconsistent with an error naming the offending key.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING
from pathlib import Path
from typing import Any, TypeVar

import yaml

from slonk.base.errors import SlonkError
from slonk.config import accounts, active_checks, patterns
from slonk.config.accounts import AccountError, AccountRules
from slonk.config.active_checks import ACTIVE_CHECKS, ACTIVE_TIMEOUT, SPREAD
from slonk.config.health_checks import (
    CHECK_OPTION_SHAPES,
    CHECK_TIMEOUT,
    HEALTH_CHECKS,
    option_rule,
)
from slonk.config.model import (
    HEALTH_PHASES,
    HOOK_PHASES,
    LDAP_ATTRIBUTES,
    MAX_PORT,
    AccountingSettings,
    ActiveCheckSettings,
    ActiveSettings,
    BackupController,
    CapacitySettings,
    CheckSettings,
    ClusterSpec,
    Database,
    Gpus,
    Group,
    GroupAccount,
    HealthSettings,
    HookSettings,
    LdapServer,
    LdapSettings,
    MailSettings,
    MetricsSettings,
    NodePool,
    Partition,
    Placement,
    Priority,
    PriorityWeights,
    RecycleSettings,
    RestApiSettings,
    Rule,
    SshSettings,
    SyncerSettings,
    TrendRule,
    TrendSettings,
    User,
    default_of,
    rule_of,
    rules,
)
from slonk.config.patterns import matches, shape_error
from slonk.config.trends import MAX_INCREASE, TRENDS, WINDOW

# The model's names, for the modules that read a spec through this one.
__all__ = [
    "HEALTH_CHECKS",
    "HEALTH_PHASES",
    "HOOK_PHASES",
    "LDAP_ATTRIBUTES",
    "LDAP_SUFFIX_PATTERN",
    "BackupController",
    "CapacitySettings",
    "CheckSettings",
    "ClusterSpec",
    "Gpus",
    "Group",
    "HealthSettings",
    "HookSettings",
    "LdapServer",
    "LdapSettings",
    "MailSettings",
    "MetricsSettings",
    "NodePool",
    "Partition",
    "Placement",
    "RecycleSettings",
    "RestApiSettings",
    "SpecError",
    "SyncerSettings",
    "User",
    "load_spec",
    "parse_spec",
]

SPEC_VERSION = 1
M = TypeVar("M")

DNS_LABEL_MAX = 63
# Settings slonk derives from the spec, with Slurm's aliases for them: overriding them by hand
# would desynchronize slurm.conf from the pods and their Services (AuthAlt*: from the JWT key
# the pods hold, values restapi), so they are refused in `slurmConf` and `extraLines`. Slurm
# reads keys case-insensitively, and so does this check.
MANAGED_KEYS = frozenset(
    "ClusterName SlurmctldHost ControlMachine ControlAddr BackupController BackupAddr "
    "SlurmctldAddr SlurmctldPort SlurmdPort NodeName NodeSet PartitionName FrontendName "
    "DownNodes Include SlurmctldLogFile SlurmdLogFile AuthAltTypes AuthAltParameters".split()
)
# What slonk writes on a partition's line, and Slurm's alias of one (Priority): its
# `options` may add anything else.
PARTITION_KEYS = frozenset(
    "PartitionName Nodes Default MaxTime DefaultTime PriorityTier Priority PreemptMode "
    "State".split()
)
# Pool names whose StatefulSet or node names would be another component's, and Slurm's
# keyword for the defaults of the lines after it.
RESERVED_POOL_NAMES = (
    "controller", "login", "ldap", "slurmdbd", "mariadb", "restapi", "default"
)  # fmt: skip
# Kubernetes labels every pod of a StatefulSet `controller-revision-hash: <name>-<hash>`, a
# label value of at most 63 characters with an 11-character hash: a StatefulSet with a longer
# name never makes a pod. Its pods' names (<name>-<ordinal>) then fit a DNS label too.
STATEFULSET_NAME_MAX = 52
# The longest StatefulSet name the chart makes from the release alone.
RELEASE_MAX = STATEFULSET_NAME_MAX - len("-controller")
SSH_PORT = 22  # sshd on login pods and workers
# cluster.yaml's keys beside ClusterSpec's ruled ones.
SPEC_KEYS = frozenset(
    "version clusterName release namespace nodepools partitions slurmConf "
    "cgroupConf extraLines users groups ldap ldapServer accounts hooks health syncer capacity "
    "priority accounting ssh metrics restapi backupController mail scratch".split()
)


class SpecError(SlonkError, ValueError):
    """A cluster spec that must not be applied; the message starts with the key path."""


class _Reader:
    """Typed access to one mapping of the document, errors naming `path.key`."""

    def __init__(self, data: Any, path: str, known: Collection[str]) -> None:
        if not isinstance(data, Mapping):
            raise SpecError(f"{path or '<root>'}: expected a mapping, got {_kind(data)}")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise SpecError(f"{_join(path, unknown[0])}: unknown key")
        self.data, self.path = data, path

    def at(self, key: str) -> str:
        return _join(self.path, key)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise SpecError(f"{self.at(key)}: expected {_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise SpecError(f"{self.at(key)}: expected {_name(kind)}, got {_kind(value)}")
        return value

    def require(self, key: str, kind: type | tuple[type, ...]) -> Any:
        if self.data.get(key) is None:
            raise SpecError(f"{self.at(key)}: required")
        return self.get(key, kind)

    def setting(self, cls: type, name: str) -> Any:
        """A ruled field's key (slonk.config.model.setting): its default when missing, refused
        as its Rule refuses."""
        try:
            default = default_of(cls, name)
        except LookupError:
            default = MISSING
        return self.ruled(rule_of(cls, name), default)

    def ruled(self, rule: Rule, default: Any = MISSING) -> Any:
        """The key of `rule`: `default` when missing (required without one), refused as the
        rule refuses."""
        if rule.pattern is not None:
            text = self.text(
                rule.key, rule.pattern, rule.what, None if default is MISSING else default
            )
            if text is None and default is MISSING:
                raise SpecError(f"{self.at(rule.key)}: required")
            return text
        kind = (int, float) if rule.kind is float else rule.kind
        if default is MISSING:
            value = self.require(rule.key, kind)
        else:
            value = self.get(rule.key, kind, default)
        if value is not None and (refused := rule.refuse(value)):
            raise SpecError(f"{self.at(rule.key)}: {refused}")
        return float(value) if rule.kind is float else value

    def count(
        self, key: str, default: int | None = None, minimum: int = 0, maximum: int | None = None
    ) -> int:
        value = self.require(key, int) if default is None else self.get(key, int, default)
        if value < minimum:
            raise SpecError(f"{self.at(key)}: must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise SpecError(f"{self.at(key)}: must be <= {maximum}, got {value}")
        return value

    def text(self, key: str, pattern: str, what: str, default: str | None = None) -> str | None:
        """A string (or, where Slurm reads one, an integer) of the given shape; empty or null
        is the default."""
        value = self.get(key, (str, int))
        if value is None or value == "":
            return default
        if wrong := shape_error(pattern, str(value), what):
            raise SpecError(f"{self.at(key)}: {wrong}")
        return str(value)

    def strings(self, key: str) -> tuple[str, ...]:
        items = self.get(key, list, [])
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise SpecError(f"{self.at(key)}[{i}]: expected a string, got {_kind(item)}")
        return tuple(items)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        int: "an integer",
        str: "a string",
        bool: "a boolean",
        list: "a list",
        dict: "a mapping",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _dns_label(value: str, path: str) -> str:
    if len(value) > DNS_LABEL_MAX or not matches(patterns.DNS_LABEL, value):
        raise SpecError(
            f"{path}: {value!r} is not a DNS-1123 label "
            "(lowercase letters, digits and '-', at most 63 characters)"
        )
    return value


def _is_one_of(key: str, keys: Collection[str]) -> bool:
    """Slurm reads setting names in any case: so must every check on them."""
    return key.lower() in {k.lower() for k in keys}


def _conf_map(
    reader: _Reader, key: str, reserved: Collection[str] = MANAGED_KEYS
) -> dict[str, Any]:
    """A `Key: value` override map for a Slurm config file; null drops a default. Each value
    is one token, so it can add neither an option nor a line."""
    overrides = reader.get(key, dict, {})
    seen: dict[str, str] = {}
    for name, value in overrides.items():
        path = reader.at(f"{key}.{name}")
        if not isinstance(name, str) or not matches(patterns.CONF_KEY, name):
            raise SpecError(f"{path}: not a Slurm setting name")
        if _is_one_of(name, reserved):
            raise SpecError(f"{path}: set by slonk from the spec; change the spec instead")
        if name.lower() in seen:
            raise SpecError(f"{path}: same setting as {seen[name.lower()]} (Slurm ignores case)")
        seen[name.lower()] = name
        if not (value is None or isinstance(value, str | int | bool)):
            raise SpecError(f"{path}: expected a scalar or null, got {_kind(value)}")
        if isinstance(value, str) and not matches(patterns.CONF_VALUE, value):
            raise SpecError(
                f"{path}: {value!r} must be one word of printable characters, without spaces, "
                "'#', '\"' or '\\'"
            )
    return dict(overrides)


def _extra_lines(r: _Reader, slurm_conf: dict[str, Any]) -> tuple[str, ...]:
    """extraLines: each a comment, kept as it is, or one Key=Value setting, merged into
    `slurm_conf` so that no key is ever written twice (Slurm would silently take the last)."""
    comments = []
    origin = {key.lower(): f"slurmConf.{key}" for key in slurm_conf}
    for i, line in enumerate(r.strings("extraLines")):
        path, line = f"extraLines[{i}]", line.strip(" ")
        if not matches(patterns.EXTRA_LINE, line):
            raise SpecError(
                f"{path}: {line!r} is not one 'Key=Value' slurm.conf setting (value without "
                "spaces, '#', '\"' or '\\') or a '#' comment"
            )
        if not line or line.startswith("#"):
            comments.append(line)
            continue
        key, _, value = line.partition("=")
        if _is_one_of(key, MANAGED_KEYS):
            raise SpecError(f"{path}: {key} is set by slonk from the spec")
        if key.lower() in origin:
            raise SpecError(f"{path}: {key} is set by {origin[key.lower()]} already")
        origin[key.lower()] = path
        slurm_conf[key] = value
    return tuple(comments)


def _gpus(data: Any, path: str) -> Gpus | None:
    if data is None:
        return None
    r = _Reader(data, path, _keys(Gpus))
    if r.get("count", int) is None:
        raise SpecError(f"{r.at('count')}: GPUs declared without a count")
    return _ruled(r, Gpus)


def _pool(name: str, data: Any, path: str, release: str) -> NodePool:
    _dns_label(name, path)
    if name in RESERVED_POOL_NAMES:
        raise SpecError(f"{path}: {name!r} is reserved for slonk's own pods")
    r = _Reader(
        data, path, {"replicas", "cpus", "memoryMiB", "gpus", "features", "weight", "topology"}
    )
    statefulset = f"{release}-{name}"
    if len(statefulset) > STATEFULSET_NAME_MAX:
        raise SpecError(
            f"{path}: StatefulSet name {statefulset!r} is longer than {STATEFULSET_NAME_MAX} "
            "characters (Kubernetes would make none of its pods)"
        )
    features = r.strings("features")
    for i, feature in enumerate(features):
        if not matches(patterns.SLURM_NAME, feature):
            raise SpecError(f"{r.at('features')}[{i}]: {feature!r} is not a valid Slurm feature")
    placement = _Reader(r.get("topology", dict, {}), r.at("topology"), _keys(Placement))
    return _ruled(
        r,
        NodePool,
        name=name,
        gpus=_gpus(r.data.get("gpus"), r.at("gpus")),
        features=features,
        placement=_ruled(placement, Placement),
    )


def _partition(name: str, data: Any, path: str, pools: set[str]) -> Partition:
    if not matches(patterns.SLURM_NAME, name):
        raise SpecError(f"{path}: {name!r} is not a valid Slurm partition name")
    if matches(patterns.SLURM_DEFAULT, name):
        raise SpecError(
            f"{path}: {name!r} is Slurm's keyword for the defaults of the partitions after it, "
            "not a partition"
        )
    r = _Reader(data, path, _keys(Partition, "pools", "default", "options"))
    members = r.strings("pools")
    for i, pool in enumerate(members):
        if pool not in pools:
            raise SpecError(f"{r.at('pools')}[{i}]: unknown nodepool {pool!r}")
    return _ruled(
        r,
        Partition,
        name=name,
        pools=members,
        default=r.get("default", bool, default_of(Partition, "default")),
        options=_conf_map(r, "options", reserved=PARTITION_KEYS),
    )


def _checked(r: _Reader, key: str, check: Callable[[Any], Any], value: Any) -> Any:
    """An account rule (slonk.config.accounts) applied to `key`, naming it on failure."""
    try:
        return check(value)
    except AccountError as err:
        raise SpecError(f"{r.at(key)}: {err}") from err


def _account_rules(data: Any, path: str) -> AccountRules:
    r = _Reader(data or {}, path, {"minId", "maxId", "homeRoots"})
    min_id = r.count("minId", default=accounts.MIN_ID, minimum=accounts.ID_FLOOR)
    max_id = r.count("maxId", default=accounts.MAX_ID, minimum=min_id)
    if max_id > accounts.ID_CEILING:
        raise SpecError(f"{r.at('maxId')}: must be <= {accounts.ID_CEILING}, got {max_id}")
    roots = r.strings("homeRoots") if r.get("homeRoots", list) is not None else None
    if roots == ():
        raise SpecError(f"{r.at('homeRoots')}: at least one directory")
    roots = roots or accounts.HOME_ROOTS
    for i, root in enumerate(roots):
        _checked(r, f"homeRoots[{i}]", lambda v: accounts.check_path(v, "home root"), root)
    return AccountRules(min_id=min_id, max_id=max_id, home_roots=tuple(roots))


def _group(data: Any, path: str, rules: AccountRules) -> Group:
    r = _Reader(data, path, {"name", "gid"})
    return Group(
        name=_checked(
            r, "name", lambda v: accounts.check_name(v, "group name"), r.require("name", str)
        ),
        gid=_checked(r, "gid", lambda v: rules.check_id(v, "gid"), r.require("gid", int)),
    )


def _user(data: Any, path: str, groups: set[str], rules: AccountRules) -> User:
    r = _Reader(data, path, {"name", "uid", "gid", "groups", "sshKeys", "shell"})
    name = _checked(
        r, "name", lambda v: accounts.check_name(v, "user name"), r.require("name", str)
    )
    member_of = r.strings("groups")
    for i, group in enumerate(member_of):
        if group not in groups:
            raise SpecError(f"{r.at('groups')}[{i}]: unknown group {group!r}: declare it in groups")
    keys = r.strings("sshKeys")
    return User(
        name=name,
        uid=_checked(r, "uid", lambda v: rules.check_id(v, "uid"), r.require("uid", int)),
        gid=_checked(r, "gid", lambda v: rules.check_id(v, "gid"), r.require("gid", int)),
        groups=member_of,
        ssh_keys=tuple(
            _checked(r, f"sshKeys[{i}]", accounts.check_key, k) for i, k in enumerate(keys)
        ),
        shell=_checked(
            r, "shell", accounts.check_shell, r.get("shell", str, accounts.DEFAULT_SHELL)
        ),
    )


def _ldap(data: Any, path: str) -> LdapSettings | None:
    if data is None:
        return None
    keys = "uris userBase groupBase attributes bindDN bindPasswordFile caFile"
    r = _Reader(data, path, _keys(LdapSettings, *keys.split()))
    uris = r.strings("uris")
    if not uris:
        raise SpecError(f"{r.at('uris')}: at least one ldap:// or ldaps:// URI")
    for i, uri in enumerate(uris):
        if not uri.startswith(("ldap://", "ldaps://")):
            raise SpecError(f"{r.at('uris')}[{i}]: {uri!r} is not an ldap:// or ldaps:// URI")
        port = _ldap_port(uri)
        if not 1 <= port <= MAX_PORT:
            raise SpecError(f"{r.at('uris')}[{i}]: {uri!r}: port {port} is not a TCP port")
    for key in ("userBase", "groupBase"):
        if not r.require(key, str):
            raise SpecError(f"{r.at(key)}: required")
    attributes = dict(LDAP_ATTRIBUTES)
    overrides = _Reader(r.get("attributes", dict, {}), r.at("attributes"), set(LDAP_ATTRIBUTES))
    attributes.update({k: overrides.get(k, str) for k in overrides.data})
    return _ruled(
        r,
        LdapSettings,
        uris=uris,
        user_base=r.require("userBase", str),
        group_base=r.require("groupBase", str),
        attributes=attributes,
        bind_dn=r.get("bindDN", str) or None,
        bind_password_file=r.get("bindPasswordFile", str) or None,
        ca_file=r.get("caFile", str) or None,
    )


def _ldap_port(uri: str) -> int:
    """A URI's TCP port, as the chart's NetworkPolicies read it (slonk.ldapPorts)."""
    host_port = re.sub(r"^ldaps?://([^/?]*).*$", r"\1", uri, flags=re.DOTALL)
    given = re.search(r":([0-9]+)$", host_port)
    return int(given.group(1)) if given else 636 if uri.startswith("ldaps://") else 389


def _accounts(r: _Reader, rules: AccountRules) -> tuple[list[User], list[Group]]:
    """`users` and `groups` of a mapping: names and ids unique, users' groups among its
    groups."""
    groups = [
        _group(g, r.at(f"groups[{i}]"), rules) for i, g in enumerate(r.get("groups", list, []))
    ]
    _unique([g.name for g in groups], r.at("groups"), "group")
    _unique([g.gid for g in groups], r.at("groups"), "gid", key="gid")
    names = {g.name for g in groups}
    users = [
        _user(u, r.at(f"users[{i}]"), names, rules) for i, u in enumerate(r.get("users", list, []))
    ]
    _unique([u.name for u in users], r.at("users"), "user")
    _unique([u.uid for u in users], r.at("users"), "uid", key="uid")
    return users, groups


# The development directory's suffix: it is written into slapd.conf and every seed DN.
LDAP_SUFFIX_PATTERN = r"^dc=[A-Za-z0-9-]+(,dc=[A-Za-z0-9-]+)*$"


def _ldap_server(data: Any, path: str, rules: AccountRules) -> LdapServer | None:
    if data is None:
        return None
    r = _Reader(data, path, {"suffix", "users", "groups"})
    suffix = r.require("suffix", str)
    if not re.fullmatch(LDAP_SUFFIX_PATTERN, suffix):
        raise SpecError(f"{r.at('suffix')}: {suffix!r} must be dc=...,dc=... (letters, digits, -)")
    users, groups = _accounts(r, rules)
    return LdapServer(suffix=suffix, users=tuple(users), groups=tuple(groups))


# hooks' keys for HOOK_PHASES, in their order.
PHASE_KEYS = ("prolog", "epilog", "taskProlog", "taskEpilog")


def _hooks(data: Any, path: str) -> HookSettings | None:
    if not data:
        return None
    r = _Reader(data, path, _keys(HookSettings, "link", *PHASE_KEYS))
    phases = {}
    for phase, key in zip(HOOK_PHASES, PHASE_KEYS, strict=True):
        directory = r.get(key, str)
        if directory:
            if directory.startswith("/") or ".." in directory.split("/"):
                raise SpecError(f"{r.at(key)}: {directory!r} must be a path inside the repository")
            phases[phase] = directory.strip("/")
    link = r.get("link", str, default_of(HookSettings, "link"))
    if "/" in link or not link:
        raise SpecError(f"{r.at('link')}: {link!r} must be a plain name")
    return _ruled(r, HookSettings, link=link, phases=phases)


S = TypeVar("S")


def _catalogue(
    r: _Reader, key: str, names: Collection[str], parse: Callable[[str, Any, str], S | None]
) -> dict[str, S]:
    """The entries of a catalogue under `key` (its names alone; unknown ones refused), each
    parsed over its defaults in catalogue order, and those turned off left out."""
    entries = _Reader(r.get(key, dict, {}), r.at(key), set(names))
    return {
        name: settings
        for name in names
        if (settings := parse(name, entries.data.get(name), entries.at(name)))
    }


def _check(name: str, data: Any, path: str) -> CheckSettings | None:
    """A check's settings over its defaults; each option keeps its default's type."""
    default = HEALTH_CHECKS[name]
    r = _Reader(data or {}, path, {"enabled", "phases", "timeoutSeconds", *default.options})
    if not r.get("enabled", bool, True):
        return None
    phases = r.strings("phases") or default.phases
    for i, phase in enumerate(phases):
        if phase not in HEALTH_PHASES:
            raise SpecError(f"{r.at('phases')}[{i}]: must be one of {', '.join(HEALTH_PHASES)}")
    timeout = r.ruled(CHECK_TIMEOUT, default.timeout_seconds)
    options = dict(default.options)
    for key, value in default.options.items():
        if isinstance(value, list):
            items = r.get(key, list, value)
            kind = type(value[0]) if value else str
            for i, item in enumerate(items):
                if not isinstance(item, kind) or isinstance(item, bool):
                    raise SpecError(f"{r.at(key)}[{i}]: expected {_name(kind)}")
                _check_option_shape(key, item, f"{r.at(key)}[{i}]")
            options[key] = items
        elif isinstance(value, int):
            options[key] = r.ruled(option_rule(key, value), value)
        else:
            options[key] = r.get(key, type(value), value)
            _check_option_shape(key, options[key], r.at(key))
    return CheckSettings(tuple(phases), timeout, options)


def _check_option_shape(key: str, value: Any, path: str) -> None:
    shape = CHECK_OPTION_SHAPES.get(key)
    if shape and isinstance(value, str) and (wrong := shape_error(shape[0], value, shape[1])):
        raise SpecError(f"{path}: {wrong}")


def _active_check(name: str, data: Any, path: str) -> ActiveCheckSettings | None:
    """An active check's settings over its defaults (slonk.config.active_checks)."""
    default = ACTIVE_CHECKS[name]
    r = _Reader(data or {}, path, {"enabled", ACTIVE_TIMEOUT.key, *default.options})
    if not r.get("enabled", bool, True):
        return None
    options = dict(default.options)
    probe, what = active_checks.OPTION_SHAPES["probe"]
    options["probe"] = r.text("probe", probe, what, default.options["probe"])
    options["spreadPercent"] = r.ruled(SPREAD, default.options["spreadPercent"])
    given = r.get("minimum", dict)
    if given is not None:  # the site's thresholds replace slonk's, whole
        m = _Reader(given, r.at("minimum"), given)
        if len(given) > active_checks.MAX_MODELS:
            raise SpecError(f"{r.at('minimum')}: at most {active_checks.MAX_MODELS} GPU models")
        for model in given:
            if not isinstance(model, str) or not matches(active_checks.MODEL_NAME, model):
                raise SpecError(f"{m.at(str(model))}: not a GPU model's name as nvidia-smi says it")
            figure = m.get(model, (int, float))
            if figure is None or not figure > 0:
                raise SpecError(f"{m.at(model)}: must be a number > 0")
        options["minimum"] = {model: float(figure) for model, figure in given.items()}
    return ActiveCheckSettings(r.ruled(ACTIVE_TIMEOUT, default.timeout_seconds), options)


def _command_check(name: str, data: Any, path: str) -> ActiveCheckSettings | None:
    """A site's own active check: its program, run as root on the node, and how long it may
    take (slonk.config.active_checks, COMMAND_NAME)."""
    if not matches(active_checks.COMMAND_NAME, name):
        raise SpecError(
            f"{path}: a check's name is a word of lower-case letters, digits and - (not last)"
        )
    if name in ACTIVE_CHECKS:
        raise SpecError(f"{path}: {name} is slonk's own check: health.active.checks.{name}")
    r = _Reader(data, path, {"enabled", "command", ACTIVE_TIMEOUT.key, active_checks.SPAN.key})
    # Both required, even of a check turned off, as the schema has them.
    shape, what = active_checks.OPTION_SHAPES["probe"]
    program = r.get("command", str)
    if not program:
        raise SpecError(f"{r.at('command')}: required: the program to run, and its options")
    if wrong := shape_error(shape, program, what):
        raise SpecError(f"{r.at('command')}: {wrong}")
    timeout = r.ruled(ACTIVE_TIMEOUT)
    options = {
        "command": program,
        active_checks.SPAN.key: r.ruled(active_checks.SPAN, active_checks.NODE),
    }
    return ActiveCheckSettings(timeout, options) if r.get("enabled", bool, True) else None


def _command_checks(r: _Reader) -> dict[str, ActiveCheckSettings]:
    """The site's own active checks, `commands` (the enabled ones)."""
    given = r.get("commands", dict, {})
    if len(given) > active_checks.MAX_COMMANDS:
        raise SpecError(f"{r.at('commands')}: at most {active_checks.MAX_COMMANDS} checks")
    found = {
        name: _command_check(str(name), data, r.at(f"commands.{name}"))
        for name, data in given.items()
    }
    return {name: check for name, check in found.items() if check is not None}


def _active(data: Any, path: str) -> ActiveSettings | None:
    r = _Reader(data or {}, path, _keys(ActiveSettings, "enabled", "checks", "commands"))
    # Off unless asked for (values.yaml says why).
    if not r.get("enabled", bool, False):
        return None
    checks = _catalogue(r, "checks", ACTIVE_CHECKS, _active_check)
    return _ruled(r, ActiveSettings, checks={**checks, **_command_checks(r)})


def _check_preemption(partitions: list[Partition], slurm_conf: Mapping[str, Any]) -> None:
    """Active checks run in their own partition, the lowest tier, which any user's job
    preempts (slonk.config.render): the partition name is theirs, the tier under every user
    partition's, and preemption by partition tier."""
    for partition in partitions:
        if partition.name.lower() == active_checks.PARTITION:
            raise SpecError(
                f"partitions.{partition.name}: the active checks' partition "
                "(health.active); name yours otherwise"
            )
        if partition.priority_tier == active_checks.PRIORITY_TIER:
            raise SpecError(
                f"partitions.{partition.name}.priorityTier: {active_checks.PRIORITY_TIER} is the "
                "active checks' tier, which every user's job preempts: give 1 or more, or turn "
                "health.active off"
            )
    preempt = next((v for k, v in slurm_conf.items() if k.lower() == "preempttype"), None)
    if preempt not in (None, active_checks.PREEMPT_TYPE):
        raise SpecError(
            f"slurmConf.PreemptType: {preempt!r}: active checks need "
            f"{active_checks.PREEMPT_TYPE} (users' jobs preempt them by partition tier); "
            "turn health.active off to use another"
        )


def _trend_rule(name: str, data: Any, path: str) -> TrendRule | None:
    """A trend rule's settings over its defaults (slonk.config.trends)."""
    default = TRENDS[name]
    r = _Reader(data or {}, path, {"enabled", MAX_INCREASE.key, WINDOW.key})
    if not r.get("enabled", bool, True):
        return None
    return TrendRule(
        default.field,
        r.ruled(MAX_INCREASE, default.max_increase),
        r.ruled(WINDOW, default.window_seconds),
    )


def _trends(data: Any, path: str) -> TrendSettings | None:
    r = _Reader(data or {}, path, _keys(TrendSettings, "enabled", "rules"))
    if not r.get("enabled", bool, False):  # off unless asked for (values.yaml says why)
        return None
    return _ruled(r, TrendSettings, rules=_catalogue(r, "rules", TRENDS, _trend_rule))


def _health(data: Any, path: str) -> HealthSettings | None:
    r = _Reader(
        data or {}, path, _keys(HealthSettings, "enabled", "checks", "recycle", "active", "trends")
    )
    if not r.get("enabled", bool, False):
        return None
    checks = _catalogue(r, "checks", HEALTH_CHECKS, _check)
    rr = _Reader(r.get("recycle", dict, {}), r.at("recycle"), _keys(RecycleSettings, "enabled"))
    recycle = _ruled(rr, RecycleSettings) if rr.get("enabled", bool, True) else None
    active = _active(r.get("active", dict, {}), r.at("active"))
    trends = _trends(r.get("trends", dict, {}), r.at("trends"))
    return _ruled(r, HealthSettings, checks=checks, recycle=recycle, active=active, trends=trends)


def _syncer(data: Any, path: str) -> SyncerSettings | None:
    r = _Reader(
        data or {}, path, _keys(SyncerSettings, "enabled", "nodeConditions", "topologyLabels")
    )
    if not r.get("enabled", bool, True):
        return None
    conditions = r.strings("nodeConditions")
    for i, kind in enumerate(conditions):
        if not matches(patterns.LABEL_KEY, kind):
            raise SpecError(f"{r.at('nodeConditions')}[{i}]: {kind!r} is not a condition type")
    labels = _Reader(r.get("topologyLabels", dict, {}), r.at("topologyLabels"), {"switch", "block"})
    return _ruled(
        r,
        SyncerSettings,
        node_conditions=conditions,
        topology_labels={
            kind: key
            for kind in ("switch", "block")
            if (key := labels.text(kind, patterns.LABEL_KEY, "a Kubernetes label key"))
        },
    )


def _service(cls: type[M], data: Any, path: str) -> M | None:
    """A service that is off when its key is absent (`metrics`, `restapi`: the chart writes
    the key when the service is enabled), its settings all ruled."""
    if data is None:
        return None
    return _ruled(_Reader(data, path, _keys(cls)), cls)


def _mail(data: Any, path: str) -> MailSettings | None:
    """Mail is on with a relay: the chart writes the section only then, and one without is off."""
    mail = _service(MailSettings, data, path)
    if not (mail and mail.relay):
        return None
    if "@" not in mail.address(mail.sender):
        # A bare "slurm" in MAIL FROM: relays refuse it, and every message with it.
        raise SpecError(
            f"{path}.sender: {mail.sender!r} needs a domain: give {path}.domain or an address"
        )
    return mail


def _capacity(data: Any, path: str) -> CapacitySettings:
    return _ruled(_Reader(data or {}, path, _keys(CapacitySettings)), CapacitySettings)


def _ssh(data: Any, path: str) -> SshSettings:
    r = _Reader(data or {}, path, _keys(SshSettings, "trustedUserCAKeys"))
    own = default_of(SshSettings, "trusted_user_ca_keys")
    return _ruled(r, SshSettings, trusted_user_ca_keys=r.get("trustedUserCAKeys", bool, own))


# MariaDB's own schemas and accounts: slurmdbd's user, granted everything on its database,
# would rule the whole server through them.
RESERVED_DATABASES = frozenset({"mysql", "sys", "performance_schema", "information_schema"})
RESERVED_DATABASE_USERS = frozenset({"root", "mysql", "public"})


def _priority(data: Any, path: str) -> Priority:
    r = _Reader(data or {}, path, _keys(Priority, "weights"))
    w = _Reader(r.get("weights", dict, {}), r.at("weights"), _keys(PriorityWeights))
    return _ruled(r, Priority, weights=_ruled(w, PriorityWeights))


def _required_text(
    r: _Reader, key: str, pattern: str, what: str, default: str | None = None
) -> str:
    value = r.text(key, pattern, what, default)
    if value is None:
        raise SpecError(f"{r.at(key)}: required")
    return value


def _account_name(r: _Reader, key: str, default: str | None = None) -> str:
    what = "a Slurm account (lowercase letters, digits, _ . -)"
    return _required_text(r, key, patterns.ACCOUNT_NAME, what, default)


def _accounting(data: Any, path: str) -> AccountingSettings | None:
    if data is None:
        return None
    r = _Reader(data, path, _keys(AccountingSettings, "host", "groupAccounts", "database"))
    mappings = []
    for i, item in enumerate(r.get("groupAccounts", list, [])):
        m = _Reader(item, r.at(f"groupAccounts[{i}]"), {"group", "account"})
        group = _checked(m, "group", accounts.check_name, m.require("group", str))
        mappings.append(GroupAccount(group=group, account=_account_name(m, "account")))
    _unique([m.group for m in mappings], r.at("groupAccounts"), "group", key="group")
    d = _Reader(r.get("database", dict, {}), r.at("database"), _keys(Database, "host"))
    database = _ruled(d, Database, host=_required_text(d, "host", patterns.DNS_NAME, "a host name"))
    for key, value, reserved in (
        ("name", database.name, RESERVED_DATABASES),
        ("user", database.user, RESERVED_DATABASE_USERS),
    ):
        if value.lower() in reserved:
            raise SpecError(
                f"{d.at(key)}: {value!r} is MariaDB's own: slurmdbd's account would rule the server"
            )
    return _ruled(
        r,
        AccountingSettings,
        host=_required_text(r, "host", patterns.DNS_NAME, "a host name"),
        group_accounts=tuple(mappings),
        database=database,
    )


def _keys(cls: type, *extra: str) -> set[str]:
    """The keys of a mapping read into `cls`: its ruled fields' and `extra`."""
    return {rule.key for rule in rules(cls).values()} | set(extra)


def _ruled(r: _Reader, cls: type[M], **given: Any) -> M:
    """`cls` from its ruled keys in `r`, and its other fields `given`."""
    return cls(**{name: r.setting(cls, name) for name in rules(cls)}, **given)


def _unique(values: list[Any], path: str, what: str, key: str = "name") -> None:
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise SpecError(f"{path}[{i}].{key}: duplicate {what} {value!r}")
        seen.add(value)


def _old_list_form(key: str, items: list[Any]) -> str:
    """The error for a list of named items (chart 0.3 and before), showing the map it
    becomes: the same text as the chart's `slonk.refuseLists`."""
    converted = {}
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            rest = {k: v for k, v in item.items() if k != "name"}
            converted[str(item.get("name", f"<name of item {i}>"))] = rest
    example = json.dumps(converted, sort_keys=True, separators=(",", ":"))
    return (
        f"{key}: a list, the form before chart 0.4.0; write a map keyed by name "
        f"instead: {key}: {example}"
    )


def _named(r: _Reader, key: str) -> list[tuple[str, Any]]:
    """A map of named items (node pools, partitions), in name order, as Helm ranges over it."""
    value = r.data.get(key)
    if isinstance(value, list):
        raise SpecError(_old_list_form(key, value))
    items = r.get(key, dict, {})
    for name in items:
        if not isinstance(name, str):
            raise SpecError(f"{r.at(key)}.{name}: expected a name, got {_kind(name)}")
    return sorted(items.items())


def parse_spec(data: Any) -> ClusterSpec:
    """Validate a parsed `cluster.yaml` document and build the spec."""
    if found := patterns.first_unsafe_value(data):
        raise SpecError(": ".join(found))
    r = _Reader(data, "", _keys(ClusterSpec, *SPEC_KEYS))
    version = r.get("version", int, SPEC_VERSION)
    if version != SPEC_VERSION:
        raise SpecError(f"version: unsupported spec version {version} (this slonk reads 1)")
    cluster_name = r.require("clusterName", str)
    if not matches(patterns.CLUSTER_NAME, cluster_name):
        raise SpecError(
            f"clusterName: {cluster_name!r} must be lowercase letters, digits or '_' "
            "(Slurm lowercases it; at most 40 characters)"
        )
    release = _dns_label(r.require("release", str), "release")
    if len(release) > RELEASE_MAX:
        raise SpecError(
            f"release: {release!r} is longer than {RELEASE_MAX} characters (StatefulSet "
            f"{release}-controller would be longer than {STATEFULSET_NAME_MAX}: Kubernetes "
            "would make none of its pods)"
        )
    pools = [_pool(name, p, f"nodepools.{name}", release) for name, p in _named(r, "nodepools")]
    pool_names = {p.name for p in pools}
    partitions = [
        _partition(name, p, f"partitions.{name}", pool_names) for name, p in _named(r, "partitions")
    ]
    defaults = [p.name for p in partitions if p.default]
    if len(defaults) > 1:
        raise SpecError(
            f"partitions.{defaults[1]}.default: only one partition can be the default "
            f"({defaults[0]} is)"
        )
    account_rules = _account_rules(r.data.get("accounts"), "accounts")
    users, groups = _accounts(r, account_rules)
    spec_default = functools.partial(default_of, ClusterSpec)
    slurm_conf = _conf_map(r, "slurmConf")
    extra_lines = _extra_lines(r, slurm_conf)
    metrics = _service(MetricsSettings, r.data.get("metrics"), "metrics")
    taken = {
        "slurmctldPort": r.get("slurmctldPort", int, spec_default("slurmctld_port")),
        "slurmdPort": r.get("slurmdPort", int, spec_default("slurmd_port")),
        "sshd": SSH_PORT,
    }
    for owner, port in taken.items():
        if metrics is not None and metrics.port == port:
            raise SpecError(f"metrics.port: {port} is {owner}'s port, in the same pods")
    health = _health(r.data.get("health"), "health")
    if health is not None and health.active is not None:
        _check_preemption(partitions, slurm_conf)
    return _ruled(
        r,
        ClusterSpec,
        cluster_name=cluster_name,
        release=release,
        namespace=_dns_label(r.get("namespace", str, spec_default("namespace")), "namespace"),
        nodepools=tuple(pools),
        partitions=tuple(partitions),
        slurm_conf=slurm_conf,
        cgroup_conf=_conf_map(r, "cgroupConf"),
        extra_lines=extra_lines,
        users=tuple(users),
        groups=tuple(groups),
        accounts=account_rules,
        ldap=_ldap(r.data.get("ldap"), "ldap"),
        ldap_server=_ldap_server(r.data.get("ldapServer"), "ldapServer", account_rules),
        hooks=_hooks(r.data.get("hooks"), "hooks"),
        health=health,
        syncer=_syncer(r.data.get("syncer"), "syncer"),
        capacity=_capacity(r.data.get("capacity"), "capacity"),
        priority=_priority(r.data.get("priority"), "priority"),
        accounting=_accounting(r.data.get("accounting"), "accounting"),
        ssh=_ssh(r.data.get("ssh"), "ssh"),
        metrics=metrics,
        restapi=_service(RestApiSettings, r.data.get("restapi"), "restapi"),
        backup_controller=_service(
            BackupController, r.data.get("backupController"), "backupController"
        ),
        mail=_mail(r.data.get("mail"), "mail"),
        scratch=r.get("scratch", bool, False),
    )


class _PlainLoader(yaml.SafeLoader):
    """YAML without aliases: the chart never writes one, and an alias nested in aliases
    expands into a document every reader of it walks exponentially long (a billion laughs
    in a ConfigMap would hang every pod). Python's parser, not libyaml's: libyaml recurses
    in C and crashes the process on a deeply nested document, Python raises."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            # types-PyYAML leaves peek_event unannotated; it returns the next Event.
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.YAMLError(f"line {mark.line + 1}: YAML aliases are not allowed here")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A key given twice is refused: YAML's last-one-wins would silently drop a node
        pool or partition that a hand-edited ConfigMap names twice."""
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int):
                continue  # an unhashable key: SafeLoader refuses it below
            if key in seen:
                mark = key_node.start_mark
                raise yaml.YAMLError(f"line {mark.line + 1}: key {key!r} given twice")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def fingerprint(content: bytes) -> str:
    """What tells one content of cluster.yaml from another."""
    return hashlib.sha256(content).hexdigest()


def read_spec(path: Path) -> tuple[ClusterSpec, str]:
    """Read and validate a `cluster.yaml` file, and the fingerprint of the very bytes read
    (the file may change a moment later); errors name the file and the key."""
    try:
        content = Path(path).read_bytes()
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror}") from err
    return spec_of(content, path), fingerprint(content)


def spec_of(content: bytes, path: Path) -> ClusterSpec:
    """Validate the bytes of a `cluster.yaml` file read from `path` (named in errors)."""
    try:
        data = yaml.load(content.decode(), Loader=_PlainLoader)  # a SafeLoader
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8: {err}") from err
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from err
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a cluster spec") from None
    try:
        return parse_spec(data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from err
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a cluster spec") from None


def load_spec(path: Path) -> ClusterSpec:
    """Read and validate a `cluster.yaml` file; errors name the file and the key."""
    return read_spec(path)[0]
