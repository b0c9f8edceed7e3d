"""Users from the development directory on a local cluster: added with ldapadd, they log in
and run jobs everywhere; the directory going away takes no one with it."""

from __future__ import annotations

import base64

import pytest

from ..support.cluster import LocalCluster, wait_for
from ..support.directory import (
    SLURM_PODS,
    SUFFIX,
    ldapadd,
    ldapdelete,
    person,
    posix_group,
    wait_directory,
    wait_on_every_pod,
)

LOGIN = "slonk-login-0"


def _can_log_in(cluster: LocalCluster, name: str) -> bool:
    return cluster.user(name).run("true").rc == 0


def _wait_logged(cluster: LocalCluster, since: int, *lines: str) -> None:
    """The login pod's sync says what it skipped once its files are written: a user who
    logs in does not mean the lines are there yet."""
    wait_for(
        f"{LOGIN} to log {lines}", lambda: all(line in cluster.log(LOGIN, since) for line in lines)
    )


def _added_lines(pod, name: str) -> list[list[str]]:
    """The lines of /etc/`name` after the image's, which must be there as they were."""
    base = pod.file(f"/var/lib/slonk/users-base/{name}").content_string.splitlines()
    lines = pod.file(f"/etc/{name}").content_string.splitlines()
    assert lines[: len(base)] == base, f"{name}: the image's lines changed"
    return [line.split(":") for line in lines[len(base) :]]


@pytest.fixture
def directory(healthy: LocalCluster) -> LocalCluster:
    wait_directory(healthy)
    return healthy


def test_a_user_added_to_ldap_logs_in_and_runs_everywhere(directory: LocalCluster):
    ldapadd(directory, person(directory, "carol", 5201))
    wait_on_every_pod(directory, "carol")
    assert _can_log_in(directory, "carol")  # with the key stored in LDAP
    ids = directory.user("carol").check_output("srun --nodes=2 id </dev/null").splitlines()
    assert ids == ["uid=5201(carol) gid=5100(research) groups=5100(research)"] * 2
    home = directory.user("carol").file("/home/carol")
    assert (home.user, home.group, home.mode) == ("carol", "research", 0o700)


def test_bad_entries_are_skipped_with_a_warning_and_the_rest_sync(directory: LocalCluster):
    offset = directory.log_offset(LOGIN)
    ldapadd(
        directory,
        "\n".join(
            [
                person(directory, "dave", 5202),
                person(directory, "eve", 5202),  # dave's uid
                person(directory, "frank", 5203, shell="/bin/nologin-x"),  # no such shell
                person(directory, "heidi", 5204),
            ]
        ),
    )
    wait_for("heidi", lambda: _can_log_in(directory, "heidi"))
    assert _can_log_in(directory, "dave")
    _wait_logged(
        directory,
        offset,
        f"skipped user uid=eve,ou=people,{SUFFIX}: uid 5202 is dave's",
        f"skipped user uid=frank,ou=people,{SUFFIX}: shell /bin/nologin-x is not in /etc/shells",
    )
    for name in ("eve", "frank"):
        assert directory.pod(LOGIN).run(f"getent passwd {name}").rc != 0


def test_users_stay_while_the_directory_is_down(directory: LocalCluster):
    ldapadd(directory, person(directory, "ivan", 5205))
    wait_on_every_pod(directory, "ivan")
    offset = directory.log_offset(LOGIN)
    directory.slonk("stop", "slonk-ldap-0")
    try:
        wait_for(
            "a sync that fails", lambda: "no LDAP server answered" in directory.log(LOGIN, offset)
        )
        assert _can_log_in(directory, "ivan")
        assert directory.user("ivan").check_output("srun --nodes=2 hostname </dev/null")
        assert directory.pod("slonk-cpu-1").run("getent passwd demo ivan").rc == 0
    finally:
        directory.slonk("restart", "slonk-ldap-0")
    # The directory kept its data (a volume): new entries flow again.
    wait_directory(directory)
    ldapadd(directory, person(directory, "grace", 5206))
    wait_for("grace", lambda: _can_log_in(directory, "grace"))


def test_hostile_entries_write_no_line_and_join_no_system_group(directory: LocalCluster):
    """The issue's entries: a base64 homeDirectory that would add a uid-0 line, a gidNumber 0
    user, groups with root's and shadow's gids listing demo."""
    offset = directory.log_offset(LOGIN)
    injected = base64.b64encode(b"/home/x\nrootkit::0:0::/root").decode()
    ldapadd(
        directory,
        "\n".join(
            [
                person(directory, "mallory", 5301, home=f"homeDirectory:: {injected}"),
                person(directory, "oscar", 5302, gid=0),
                posix_group("wheel", 0, "demo"),
                posix_group("shadowy", 42, "demo"),
                person(directory, "trent", 5303),  # a good entry in the same change: the sync ran
            ]
        ),
    )
    try:
        wait_on_every_pod(directory, "trent")
        for name in SLURM_PODS:
            pod = directory.pod(name)
            for account in ("rootkit", "mallory", "oscar"):
                assert pod.run(f"getent passwd {account}").rc != 0, (name, account)
            for fields in _added_lines(pod, "passwd"):
                assert len(fields) == 7 and int(fields[2]) >= 1000, (name, fields)
            assert [g[0] for g in _added_lines(pod, "group")].count("wheel") == 0
            assert set(pod.check_output("id -G demo").split()).isdisjoint({"0", "42"}), name
        _wait_logged(
            directory,
            offset,
            f"skipped user uid=mallory,ou=people,{SUFFIX}: home "
            "'/home/x\\nrootkit::0:0::/root' is not an absolute",
            f"skipped user uid=oscar,ou=people,{SUFFIX}: gid 0 is outside",
        )
    finally:
        ldapdelete(
            directory,
            f"uid=mallory,ou=people,{SUFFIX}",
            f"uid=oscar,ou=people,{SUFFIX}",
            f"cn=wheel,ou=groups,{SUFFIX}",
            f"cn=shadowy,ou=groups,{SUFFIX}",
        )


def test_a_newcomer_with_demos_uid_does_not_lock_demo_out(directory: LocalCluster):
    """uid=aaron sorts before uid=demo: DN order alone would hand demo's uid to aaron."""
    offset = directory.log_offset(LOGIN)
    ldapadd(
        directory, "\n".join([person(directory, "aaron", 5000), person(directory, "trudy", 5304)])
    )
    try:
        wait_on_every_pod(directory, "trudy")
        for name in SLURM_PODS:
            assert directory.pod(name).check_output("getent passwd 5000").startswith("demo:")
        assert _can_log_in(directory, "demo")
        assert not _can_log_in(directory, "aaron")
        _wait_logged(
            directory, offset, f"skipped user uid=aaron,ou=people,{SUFFIX}: uid 5000 is demo's"
        )
    finally:
        ldapdelete(directory, f"uid=aaron,ou=people,{SUFFIX}")


def test_a_pod_started_while_the_directory_is_down_has_its_users(directory: LocalCluster):
    login = directory.pod(LOGIN)
    assert login.check_output("stat -c '%U %a' /home/.slonk /home/.slonk/users.json") == (
        "root 700\nroot 600"
    )
    directory.slonk("stop", "slonk-ldap-0")
    try:
        offset = directory.log_offset(LOGIN)
        directory.slonk("restart", LOGIN)
        wait_for("demo logging in to the new login pod", lambda: _can_log_in(directory, "demo"))
        started = directory.log(LOGIN, offset)
        assert "no LDAP server answered" in started
        assert "from the last good sync" in started
        assert directory.pod(LOGIN).run("getent passwd demo").rc == 0
    finally:
        directory.slonk("restart", "slonk-ldap-0")
    wait_directory(directory)
