"""Accounting's pieces: the password file, slurmdbd.conf, the database's SQL, and which
associations the controller adds (an attacker's values on every side)."""

from __future__ import annotations

import pytest

from slonk.accounting import associations, database, password, slurmdbd
from slonk.accounting import sync as accounting_sync
from slonk.accounting.associations import Existing, parse_existing, plan, wanted
from slonk.config.model import AccountingSettings, Database, Group, GroupAccount, User

SETTINGS = AccountingSettings(
    host="slonk-slurmdbd.default.svc.cluster.local",
    database=Database(host="slonk-mariadb.default.svc.cluster.local"),
    group_accounts=(GroupAccount("physics", "physics"), GroupAccount("gpu", "gpu-users")),
)
HOSTILE = [
    "pw\nStorageHost=evil",  # a line of its own
    "pw#rest",  # a comment
    'pw"',  # a quote
    "pw\\",  # a continuation
    "pw StorageUser=root",  # a second token
    "'; DROP DATABASE slurm_acct_db; --",
    "",
    "x" * 129,
    "pässword",
    "pw\x00",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_password_that_is_not_one_token_is_refused(value):
    with pytest.raises(password.PasswordError, match="/accounting/password"):
        password.check(value)


def test_the_password_file(tmp_path):
    secret = tmp_path / "password"
    with pytest.raises(password.PasswordError, match="no database password"):
        password.read(secret)
    secret.write_text("s3cr3t'$!\n")
    assert password.read(secret) == "s3cr3t'$!"
    secret.write_text("two\nlines\n")
    with pytest.raises(password.PasswordError, match=str(secret)):
        password.read(secret)
    secret.write_bytes(b"\xff\xfe")
    with pytest.raises(password.PasswordError, match="not ASCII"):
        password.read(secret)


def test_slurmdbd_conf():
    text = slurmdbd.render(SETTINGS, "slonk-slurmdbd-0", "Abc123;'$")
    lines = text.splitlines()
    assert "DbdHost=slonk-slurmdbd-0" in lines
    assert "DbdPort=6819" in lines
    assert "SlurmUser=slurm" in lines
    assert "StorageType=accounting_storage/mysql" in lines
    assert "StorageHost=slonk-mariadb.default.svc.cluster.local" in lines
    assert "StoragePort=3306" in lines
    assert "StorageLoc=slurm_acct_db" in lines
    assert "StorageUser=slurm" in lines
    assert "StoragePass=Abc123;'$" in lines
    assert not any(line.startswith("StorageParameters") for line in lines)
    assert all(line.startswith("#") or line.count("=") >= 1 for line in lines)
    tls = AccountingSettings(host="h", database=Database(host="db.example.org", tls=True))
    assert "StorageParameters=SSL_CA=/var/run/secrets/slonk/accounting-ca/ca.crt" in (
        slurmdbd.render(tls, "h", "pw").splitlines()
    )
    assert not any(line.startswith("AuthAlt") for line in lines)
    with_api = slurmdbd.render(SETTINGS, "h", "pw", jwt=True).splitlines()
    assert "AuthAltTypes=auth/jwt" in with_api
    assert "AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key" in with_api


@pytest.mark.parametrize("value", HOSTILE)
def test_slurmdbd_conf_refuses_a_hostile_password(value):
    with pytest.raises(password.PasswordError):
        slurmdbd.render(SETTINGS, "slonk-slurmdbd-0", value)


def test_native_password_hash():
    # MySQL's PASSWORD('password'), as every MySQL and MariaDB computes it.
    assert database.native_password_hash("password") == "*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19"


@pytest.mark.parametrize("secret", ["x';DROP DATABASE mysql;--", "a'b", "p\\'; GRANT"])
def test_the_password_never_reaches_sql(secret):
    sql = database.init_sql(SETTINGS.database, database.native_password_hash(secret))
    assert secret not in sql
    assert "DROP" not in sql and "\\" not in sql
    assert sql.count("'") == 3 * 4 + 2 * 2  # user and host in 3 statements, the hash in 2
    assert "CREATE DATABASE IF NOT EXISTS `slurm_acct_db`;" in sql.splitlines()


@pytest.mark.parametrize(
    ("name", "user", "message"),
    [("db`; DROP", "slurm", "database.name"), ("slurm_acct_db", "x'@'%", "database.user")],
)
def test_names_in_sql_are_checked_again(name, user, message):
    with pytest.raises(database.DatabaseError, match=message):
        database.init_sql(Database(host="h", name=name, user=user), "*" + "0" * 40)
    with pytest.raises((database.DatabaseError, ValueError)):
        database.init_sql(Database(host="h"), "*' OR 1=1; --" + "0" * 28)


def test_server_config():
    lines = database.server_config(Database(host="h", port=3307)).splitlines()
    assert "port=3307" in lines and "skip-name-resolve" in lines
    assert f"init-file={database.INIT_SQL}" in lines
    assert not any(line.startswith("bind-address") for line in lines)  # every address


USERS = [
    User("ann", 5001, 5001, groups=("physics", "gpu")),
    User("bob", 5002, 5100),  # primary group physics
    User("cy", 5003, 5003),
]
GROUPS = [Group("physics", 5100), Group("gpu", 5200), Group("ann", 5001), Group("cy", 5003)]


def test_wanted_accounts_follow_groups_in_mapping_order():
    assert wanted(USERS, GROUPS, SETTINGS) == {
        "ann": ("physics", "gpu-users"),
        "bob": ("physics",),
        "cy": ("research",),
    }


def test_a_new_cluster_gets_everything():
    commands, warnings = plan("local", wanted(USERS, GROUPS, SETTINGS), Existing())
    assert warnings == []
    assert commands == [
        ["add", "cluster", "local"],
        ["add", "account", "gpu-users,physics,research", "cluster=local"],
        ["add", "user", "ann,bob", "account=physics", "defaultaccount=physics", "cluster=local"],
        ["add", "user", "cy", "account=research", "defaultaccount=research", "cluster=local"],
        ["add", "user", "ann", "account=gpu-users", "cluster=local"],
    ]


def test_only_what_is_missing_is_added_and_nothing_else_touched():
    existing = Existing(
        cluster=True,
        accounts=frozenset({"physics", "research", "old"}),
        # ann's default was chosen by someone else; dave left the directory.
        users={"ann": frozenset({"research"}), "bob": frozenset({"physics"}),
               "dave": frozenset({"old"})},
    )  # fmt: skip
    commands, _ = plan("local", wanted(USERS, GROUPS, SETTINGS), existing)
    assert commands == [
        ["add", "account", "gpu-users", "cluster=local"],
        ["add", "user", "cy", "account=research", "defaultaccount=research", "cluster=local"],
        ["add", "user", "ann", "account=gpu-users", "cluster=local"],
        ["add", "user", "ann", "account=physics", "cluster=local"],
    ]
    assert all(c[0] == "add" for c in commands)
    everything = Existing(True, frozenset({"physics", "research", "gpu-users"}), {
        "ann": frozenset({"physics", "gpu-users"}), "bob": frozenset({"physics"}),
        "cy": frozenset({"research"}),
    })  # fmt: skip
    assert plan("local", wanted(USERS, GROUPS, SETTINGS), everything) == ([], [])
    # A sync that found nobody (a failed or partial search never gets here, but even so).
    assert plan("local", {}, everything) == ([], [])


@pytest.mark.parametrize(
    ("user", "accounts"),
    [("a=b", ("x",)), ("ann", ("x,y",)), ("ann", ("x cluster=other",)), ("-i", ("x",)),
     ("ann", ())],
)  # fmt: skip
def test_names_that_would_be_sacctmgr_syntax_are_skipped(user, accounts):
    commands, warnings = plan("local", {user: accounts}, Existing(cluster=True))
    assert commands == [] and len(warnings) == 1
    assert plan("bad=name", {}, Existing())[0] == []


def test_sacctmgr_output_is_parsed_warily():
    existing = parse_existing(
        "local",
        "other\nlocal\n",
        "root|\nroot|root\nresearch|\nresearch|demo\nphysics|demo\n|ghost\nno fields\na|b|c\n",
    )
    assert existing.cluster
    assert existing.accounts == {"root", "research"}
    assert existing.users == {"root": {"root"}, "demo": {"research", "physics"}}
    assert not parse_existing("local", "locals\n", "").cluster


def test_a_pass_waits_for_slurmdbd_and_keeps_the_last_users(monkeypatch, demo_spec):
    from dataclasses import replace

    from slonk.config.spec import parse_spec

    spec = replace(parse_spec(demo_spec), accounting=SETTINGS)
    calls = []

    def ensure(cluster, users, groups, settings, max_job_count):
        assert max_job_count == 10000  # Slurm's default, which slonk writes out
        calls.append([u.name for u in users])
        if len(calls) == 1:
            raise associations.AccountingUnavailable("sacctmgr show cluster: no answer")
        return 1, []

    monkeypatch.setattr(accounting_sync, "ensure", ensure)
    passes = accounting_sync.Associations()
    passes.apply(spec)  # nothing synced yet: nothing to do
    assert calls == []
    from slonk.users.admit import Result

    passes.synced(Result(users=[USERS[0]], groups=[]))
    passes.apply(spec)
    assert passes.pending  # slurmdbd did not answer: retried
    passes.synced(None)  # a failed sync keeps the last good users
    passes.apply(spec)
    assert not passes.pending and calls == [["ann"], ["ann"]]
    passes.apply(spec)
    assert len(calls) == 2  # done until the next sync


@pytest.mark.parametrize(
    ("current", "wanted"),
    [
        ("normal|\n", ["modify", "qos", "normal", "set", "MaxSubmitJobsPerUser=1000"]),
        ("normal|50\n", None),  # an operator's own limit stays
        ("", None),  # no QOS normal: nothing to set (ensure warns)
        ("normal2|\nx\n", None),  # untrusted lines name only what they name
    ],
)
def test_the_qos_gets_a_per_user_submit_limit_only_while_it_has_none(current, wanted):
    """A tenth of the job table per user; an operator's own limit stays."""
    limit = associations.submit_limit(10000)
    assert associations.submit_limit_command(current, limit) == wanted


def test_local_up_reads_slurmctlds_associations_warily():
    from slonk.local.associations import parse_users

    output = (
        "ClusterName=local Account=root UserName= Partition= Priority=0 ID=1\n"
        "ClusterName=local Account=research UserName=demo(5000) Partition= ID=3\n"
        "ClusterName=local Account=x UserName=evil\\nUserName=ann(1) ID=4\n"
        "ClusterName=local Account=x UserName=bob(4294967294) ID=5\n"
    )
    assert parse_users(output, ["demo", "cy"]) == {"demo"}
    assert parse_users("", ["demo"]) == set()


def test_slurmdbd_waits_for_its_database_within_a_bound():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        up = AccountingSettings(host="h", database=Database(host="127.0.0.1", port=port))
        assert "answers" in slurmdbd.wait_for_database(up, timeout=5)
    down = AccountingSettings(host="h", database=Database(host="127.0.0.1", port=port))
    assert "slurmdbd will keep trying" in slurmdbd.wait_for_database(down, timeout=0)


@pytest.mark.parametrize(
    ("qos", "limit_set", "warned"),
    [("normal|\n", True, False), ("normal|50\n", False, False), ("", False, True)],
)
def test_ensure_sets_the_limit_once_and_warns_without_the_qos(monkeypatch, qos, limit_set, warned):
    ran = []

    def sacctmgr(args):
        ran.append(list(args))
        return {"cluster": "c\n", "association": "", "qos": qos}.get(args[1], "")

    monkeypatch.setattr(associations, "sacctmgr", sacctmgr)
    _, warnings = associations.ensure("c", [], [], SETTINGS, 10000)
    modified = [a for a in ran if a[0] == "modify"]
    assert modified == (
        [["modify", "qos", "normal", "set", "MaxSubmitJobsPerUser=1000"]] if limit_set else []
    )
    assert any("no QOS normal" in w for w in warnings) == warned
