"""The account rules (slonk.config.accounts): what each accepts, that the chart refuses the
same values, and that the development directory's seed cannot be made to say more."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from slonk.base import paths
from slonk.config import accounts
from slonk.config.accounts import AccountError, AccountRules
from slonk.config.spec import LDAP_SUFFIX_PATTERN, Group, SpecError, User, parse_spec
from slonk.kube import chart
from slonk.pod.ldapdev import DevDirectory, seed_ldif

RULES = AccountRules()


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (accounts.check_name, "root\n"),
        (accounts.check_name, "modulefiles"),  # would own the site's /home/modulefiles
        (accounts.check_name, "a\rb"),
        (accounts.check_name, "a\x00"),
        (accounts.check_name, "a:b"),
        (accounts.check_name, "a b"),
        (accounts.check_name, "-a"),
        (accounts.check_name, "Alice"),
        (accounts.check_name, "a" * 33),
        (accounts.check_name, ""),
        (accounts.check_shell, "/bin/bash\n"),
        (accounts.check_shell, "/bin/ba:sh"),
        (accounts.check_shell, "bin/bash"),
        (accounts.check_shell, "/bin/../bash"),
        (accounts.check_shell, "/bin//bash"),
        (accounts.check_shell, "/bin/bash/"),
        (accounts.check_shell, "/"),
        (accounts.check_shell, "/" + "a" * 4095),
        (RULES.check_home, "/home/a\n"),
        (RULES.check_home, "/home/a\x00"),
        (RULES.check_home, "/home/a:b"),
        (RULES.check_home, "/home/../etc"),
        (RULES.check_home, "/home/.slonk"),
        (RULES.check_home, "/home"),
        (RULES.check_home, "/homes/a"),
        (RULES.check_home, "/etc/a"),
        (RULES.check_home, "//home/a"),
        (accounts.check_key, "ssh-ed25519 A a\nssh-ed25519 B b"),
        (accounts.check_key, "ssh-ed25519 A a\rb"),
        (accounts.check_key, "ssh-ed25519 A\x00"),
        (accounts.check_key, "ssh-ed25519 A \u00e9"),
        (accounts.check_key, "   "),
        (accounts.check_key, "ssh-rsa " + "A" * accounts.KEY_MAX_CHARS),
        (RULES.check_id, 0),
        (RULES.check_id, 42),
        (RULES.check_id, 999),
        (RULES.check_id, 60001),
        (RULES.check_id, True),
        (AccountRules(max_id=2**31 - 1).check_id, 65533),
        (AccountRules(max_id=2**31 - 1).check_id, 65534),
        (AccountRules(max_id=2**31 - 1).check_id, 65535),
    ],
)
def test_each_rule_refuses(check, value):
    with pytest.raises(AccountError):
        check(value)


def test_and_accepts():
    assert accounts.check_name("_svc-1") == "_svc-1"
    assert accounts.check_shell("/usr/bin/bash", {"/usr/bin/bash"}) == "/usr/bin/bash"
    assert RULES.check_home("/home/research/a.b+c@d") == "/home/research/a.b+c@d"
    assert accounts.check_key("  ssh-ed25519 AAAA a@b c\n") == "ssh-ed25519 AAAA a@b c"
    assert AccountRules(max_id=2**31 - 1).check_id(65536) == 65536


def test_a_key_the_size_of_the_limit_is_checked_in_linear_time():
    """Spaces then a bad character: a backtracking pattern would take minutes here."""
    accounts.check_key("ssh-rsa " + "A" * (accounts.KEY_MAX_CHARS - 9))
    with pytest.raises(AccountError):
        accounts.check_key("a" + " " * (accounts.KEY_MAX_CHARS - 2) + "\x00")


# The chart refuses the same values: one pattern, in the schema and in Python.


def _schema():
    return json.loads((paths.chart_dir() / "values.schema.json").read_text())


def test_the_schema_holds_the_same_patterns():
    defs = _schema()["$defs"]
    assert defs["accountName"]["pattern"] == accounts.NAME_PATTERN
    assert defs["accountPath"]["pattern"] == accounts.PATH_PATTERN
    assert defs["accountPath"]["maxLength"] == accounts.PATH_MAX_CHARS
    assert defs["sshKey"]["pattern"] == accounts.KEY_SCHEMA_PATTERN
    assert defs["sshKey"]["maxLength"] == accounts.KEY_MAX_CHARS
    assert defs["accountId"]["minimum"] == accounts.ID_FLOOR
    assert defs["accountId"]["maximum"] == accounts.ID_CEILING
    assert defs["accountId"]["not"]["enum"] == sorted(accounts.RESERVED_IDS)
    assert defs["accountName"]["not"]["enum"] == sorted(accounts.RESERVED_NAMES)
    suffix = _schema()["properties"]["ldap"]["properties"]["dev"]["properties"]["suffix"]
    assert suffix["pattern"] == LDAP_SUFFIX_PATTERN


def test_the_values_file_shows_slonks_own_defaults():
    values = yaml.safe_load((paths.chart_dir() / "values.yaml").read_text())["accounts"]
    assert values == {
        "minId": accounts.MIN_ID,
        "maxId": accounts.MAX_ID,
        "homeRoots": list(accounts.HOME_ROOTS),
    }


def _render(values):
    return chart.render(chart.default_chart(), chart.deep_merge(chart.user_values([]), values))


ALICE = {"name": "alice", "uid": 2001, "gid": 2001}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"users": [{**ALICE, "name": "alice\n"}]}, "at '/users/0/name'"),
        (
            {"users": [{**ALICE, "shell": "/bin/sh\nrootkit::0:0::/root:/bin/sh"}]},
            "at '/users/0/shell'",
        ),
        (
            {"users": [{**ALICE, "sshKeys": ["ssh-ed25519 A a\nssh-ed25519 EVE eve"]}]},
            "at '/users/0/sshKeys/0'",
        ),
        ({"users": [{**ALICE, "groups": ["research\n"]}]}, "at '/users/0/groups/0'"),
        ({"users": [{**ALICE, "uid": 0}]}, "at '/users/0/uid'"),
        ({"users": [{**ALICE, "uid": 65534}]}, "at '/users/0/uid'"),
        ({"users": [{**ALICE, "uid": 65533}]}, "at '/users/0/uid'"),
        ({"users": [{**ALICE, "uid": 60001}]}, "users[0].uid: uid 60001 is outside 1000-60000"),
        ({"users": [{**ALICE, "gid": 42}]}, "users[0].gid: gid 42 is outside 1000-60000"),
        ({"groups": [{"name": "wheel", "gid": 0}]}, "at '/groups/0/gid'"),
        ({"groups": [{"name": "wheel", "gid": 999}]}, "groups[0].gid: gid 999 is outside"),
        (
            {"ldap": {"dev": {"users": [{**ALICE, "uid": 70000}]}}},
            "ldap.dev.users[0].uid: uid 70000 is outside 1000-60000",
        ),
        (
            {"ldap": {"dev": {"users": [{**ALICE, "name": "a\nuserPassword: x"}]}}},
            "at '/ldap/dev/users/0/name'",
        ),
        ({"ldap": {"dev": {"suffix": "dc=x\nuserPassword: x"}}}, "at '/ldap/dev/suffix'"),
        ({"ldap": {"minUid": 1000}}, "additional properties 'minUid' not allowed"),
        ({"accounts": {"minId": 5000, "maxId": 100}}, "accounts.maxId: must be >= 5000, got 100"),
        ({"accounts": {"homeRoots": ["/"]}}, "at '/accounts/homeRoots/0'"),
        ({"accounts": {"maxId": 2**32}}, "at '/accounts/maxId'"),
    ],
)
def test_the_chart_refuses_bad_accounts(values, message):
    with pytest.raises(chart.ChartError) as caught:
        _render(values)
    assert message in str(caught.value)


# What the schema cannot say (unique names and ids, declared groups, the id range): the
# chart refuses it with the very message the pods' parser gives, naming the same key, so a
# chart that renders never leaves every pod refusing its cluster.yaml.

BOB = {"name": "bob", "uid": 2002, "gid": 2002}
RESEARCH = {"name": "research", "gid": 3000}
PARITY = {
    "duplicate gid": ("groups", [RESEARCH, {"name": "other", "gid": 3000}]),
    "duplicate group name": ("groups", [RESEARCH, {"name": "research", "gid": 3001}]),
    "gid out of range": ("groups", [{"name": "wheel", "gid": 999}]),
    "duplicate uid": ("users", [ALICE, {**BOB, "uid": 2001}]),
    "duplicate user name": ("users", [ALICE, {**BOB, "name": "alice"}]),
    "undeclared group": ("users", [{**ALICE, "groups": ["nosuch"]}]),
    "gid out of range (user)": ("users", [{**ALICE, "gid": 60001}]),
}
DEV_KEYS = {"users": "ldapServer.users", "groups": "ldapServer.groups"}


def _spec_error(key, value):
    """The pods' message for cluster.yaml with `key` set as the chart would write it."""
    data = yaml.safe_load(
        yaml.safe_load(
            next(
                t
                for p, t in _render({"ldap": {"dev": {"enabled": True}}}).items()
                if p.endswith("cluster-configmap.yaml")
            )
        )["data"]["cluster.yaml"]
    )
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = value
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return str(caught.value)


@pytest.mark.parametrize("dev", [False, True], ids=["static", "ldap.dev"])
@pytest.mark.parametrize(("key", "value"), PARITY.values(), ids=PARITY)
def test_the_chart_and_the_pods_refuse_the_same_accounts_with_one_message(key, value, dev):
    spec_key = DEV_KEYS[key] if dev else key
    message = _spec_error(spec_key, value)
    assert message.startswith(f"{spec_key}["), message
    values = {"ldap": {"dev": {"enabled": True, key: value}}} if dev else {key: value}
    with pytest.raises(chart.ChartError) as caught:
        _render(values)
    expected = message.replace("ldapServer.", "ldap.dev.", 1)
    assert expected in str(caught.value)


def test_the_chart_passes_the_range_to_every_pod():
    rendered = _render(
        {
            "accounts": {"minId": 100, "maxId": 200000, "homeRoots": ["/data"]},
            "users": [{"name": "svc", "uid": 150, "gid": 150}],
        }
    )
    config = next(t for p, t in rendered.items() if p.endswith("cluster-configmap.yaml"))
    spec = parse_spec(yaml.safe_load(yaml.safe_load(config)["data"]["cluster.yaml"]))
    assert spec.accounts == AccountRules(100, 200000, ("/data",))
    assert [u.uid for u in spec.users] == [150]


def test_git_syncs_ids_are_reserved():
    """The hooks sidecar writes the hook scripts as this uid: no account may have it."""
    rendered = _render({"hooks": {"enabled": True, "git": {"repo": "https://git.example/h"}}})
    workers = next(t for p, t in rendered.items() if p.endswith("workers.yaml"))
    sts = next(d for d in yaml.safe_load_all(workers) if d and d["kind"] == "StatefulSet")
    (sidecar,) = [
        c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "git-sync"
    ]
    ids = sidecar["securityContext"]["runAsUser"], sidecar["securityContext"]["runAsGroup"]
    assert set(ids) <= set(accounts.RESERVED_IDS)


# The development directory's seed: LDIF that says exactly what the values say.


def _parse_ldif(text):
    """[{attribute: [values]}], decoding base64 values, for the checks below."""
    entries = []
    for block in text.strip().split("\n\n"):
        entry: dict[str, list[str]] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            if value.startswith(":"):
                value = base64.b64decode(value[1:].strip()).decode()
            else:
                value = value[1:]
            entry.setdefault(name, []).append(value)
        entries.append(entry)
    return entries


def test_the_seed_encodes_every_value_that_could_start_a_line():
    hostile = User(
        name="eve",
        uid=2001,
        gid=2001,
        shell="/bin/sh\nuidNumber: 0",
        home="/home/eve\n\ndn: cn=admin,dc=x\nuserPassword: x",
        ssh_keys=("ssh-ed25519 A a\nuidNumber: 0", " lead", "trail ", ":x", "<x"),
    )
    entries = _parse_ldif(seed_ldif("dc=x", [hostile], [Group("research", 3000)]))
    assert [e["dn"] for e in entries] == [
        ["dc=x"],
        ["ou=people,dc=x"],
        ["ou=groups,dc=x"],
        ["uid=eve,ou=people,dc=x"],
        ["cn=research,ou=groups,dc=x"],
    ]
    eve = entries[3]
    assert eve["uidNumber"] == ["2001"]
    assert eve["loginShell"] == [hostile.shell]
    assert eve["homeDirectory"] == [hostile.home]
    assert eve["sshPublicKey"] == list(hostile.ssh_keys)


@pytest.mark.parametrize(
    ("suffix", "password"),
    [
        ("dc=x\ndatabase config", "secret"),
        ('dc=x"', "secret"),
        ("dc=x", "secret\nrootdn cn=evil"),
        ("dc=x", 'se"cret'),
        ("dc=x", "se cret"),
    ],
)
def test_the_dev_directory_refuses_what_would_add_slapd_settings(tmp_path, suffix, password):
    with pytest.raises(ValueError):
        DevDirectory(suffix=suffix, admin_password=password, data_dir=tmp_path, conf_dir=tmp_path)
