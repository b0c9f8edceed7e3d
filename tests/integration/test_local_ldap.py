"""Users from the development directory on a local cluster: added with ldapadd, they log in
and run jobs everywhere; the directory going away takes no one with it."""

from __future__ import annotations

import pytest

from .conftest import LocalCluster, wait_for

SUFFIX = "dc=slonk,dc=local"
INTERVAL = 5  # local mode's ldap.syncIntervalSeconds


def _ldapadd(cluster: LocalCluster, ldif: str) -> None:
    pod = cluster.pod("slonk-ldap-0")
    command = (f"ldapadd -x -H ldap://localhost -D cn=admin,{SUFFIX} "
               "-w \"$(cat /var/run/secrets/slonk/ldap-admin/password)\" <<'LDIF'\n"
               f"{ldif}\nLDIF")
    pod.check_output(command)


def _person(cluster: LocalCluster, name: str, uid: int, gid: int = 5100,
            shell: str = "/bin/bash") -> str:
    key = (cluster.state_dir / "ssh" / "id_ed25519.pub").read_text().strip()
    return "\n".join([
        f"dn: uid={name},ou=people,{SUFFIX}", "objectClass: inetOrgPerson",
        "objectClass: posixAccount", "objectClass: ldapPublicKey", f"uid: {name}", f"cn: {name}",
        f"sn: {name}", f"uidNumber: {uid}", f"gidNumber: {gid}", f"homeDirectory: /home/{name}",
        f"loginShell: {shell}", f"sshPublicKey: {key}", ""])


def _can_log_in(cluster: LocalCluster, name: str) -> bool:
    return cluster.user(name).run("true").rc == 0


def _wait_on_every_pod(cluster: LocalCluster, name: str) -> None:
    """Each pod syncs on its own clock: within one interval (plus a sync) all have the user."""
    pods = ("slonk-login-0", "slonk-cpu-0", "slonk-cpu-1", "slonk-controller-0")
    wait_for(f"{name} on every pod", lambda: all(
        cluster.pod(p).run(f"getent passwd {name}").rc == 0 for p in pods), timeout=INTERVAL + 5)


@pytest.fixture
def directory(healthy: LocalCluster) -> LocalCluster:
    wait_for("the directory", lambda: healthy.pod("slonk-ldap-0").run(
        f"ldapsearch -x -H ldap://localhost -b {SUFFIX} -s base").rc == 0)
    return healthy


def test_a_user_added_to_ldap_logs_in_and_runs_everywhere(directory: LocalCluster):
    _ldapadd(directory, _person(directory, "carol", 5201))
    _wait_on_every_pod(directory, "carol")
    assert _can_log_in(directory, "carol")  # with the key stored in LDAP
    ids = directory.user("carol").check_output("srun --nodes=2 id </dev/null").splitlines()
    assert ids == ["uid=5201(carol) gid=5100(research) groups=5100(research)"] * 2
    home = directory.user("carol").file("/home/carol")
    assert (home.user, home.group, home.mode) == ("carol", "research", 0o700)


def test_bad_entries_are_skipped_with_a_warning_and_the_rest_sync(directory: LocalCluster):
    _ldapadd(directory, "\n".join([
        _person(directory, "dave", 5202),
        _person(directory, "eve", 5202),                          # dave's uid
        _person(directory, "frank", 5203, shell="/bin/nologin-x"),  # no such shell
        _person(directory, "heidi", 5204),
    ]))
    wait_for("heidi", lambda: _can_log_in(directory, "heidi"), timeout=INTERVAL + 5)
    assert _can_log_in(directory, "dave")
    log = directory.log("slonk-login-0")
    assert f"skipped user uid=eve,ou=people,{SUFFIX} (eve, uid 5202): duplicate uid" in log
    assert "(frank, shell /bin/nologin-x): invalid shell" in log
    for name in ("eve", "frank"):
        assert directory.pod("slonk-login-0").run(f"getent passwd {name}").rc != 0


def test_users_stay_while_the_directory_is_down(directory: LocalCluster):
    _ldapadd(directory, _person(directory, "ivan", 5205))
    _wait_on_every_pod(directory, "ivan")
    directory.slonk("stop", "slonk-ldap-0")
    try:
        wait_for("a sync that fails", lambda: "no LDAP server answered" in directory.log(
            "slonk-login-0"), timeout=INTERVAL + 10)
        assert _can_log_in(directory, "ivan")
        assert directory.user("ivan").check_output("srun --nodes=2 hostname </dev/null")
        assert directory.pod("slonk-cpu-1").run("getent passwd demo ivan").rc == 0
    finally:
        directory.slonk("restart", "slonk-ldap-0")
    # The directory kept its data (a volume): new entries flow again.
    wait_for("the directory", lambda: directory.pod("slonk-ldap-0").run(
        f"ldapsearch -x -H ldap://localhost -b {SUFFIX} -s base").rc == 0)
    _ldapadd(directory, _person(directory, "grace", 5206))
    wait_for("grace", lambda: _can_log_in(directory, "grace"), timeout=INTERVAL + 5)
