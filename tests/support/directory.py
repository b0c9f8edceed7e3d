"""The local cluster's development directory (a real slapd pod), as the tests change it:
entries added and deleted with ldapadd/ldapdelete as its admin, waits until every pod has
synced them."""

from __future__ import annotations

from .cluster import LocalCluster, wait_for

SUFFIX = "dc=slonk,dc=local"


def ldapadd(cluster: LocalCluster, ldif: str) -> None:
    pod = cluster.pod("slonk-ldap-0")
    command = (
        f"ldapadd -x -H ldap://localhost -D cn=admin,{SUFFIX} "
        "-w \"$(cat /var/run/secrets/slonk/ldap-admin/password)\" <<'LDIF'\n"
        f"{ldif}\nLDIF"
    )
    pod.check_output(command)


def ldapdelete(cluster: LocalCluster, *dns: str) -> None:
    cluster.pod("slonk-ldap-0").check_output(
        f"ldapdelete -x -H ldap://localhost -D cn=admin,{SUFFIX} "
        '-w "$(cat /var/run/secrets/slonk/ldap-admin/password)" '
        + " ".join(f"'{dn}'" for dn in dns)
    )


def person(
    cluster: LocalCluster,
    name: str,
    uid: int,
    gid: int = 5100,
    shell: str = "/bin/bash",
    home: str | None = None,
) -> str:
    """An entry with the local client key; `home` is its homeDirectory line, as written."""
    key = (cluster.state_dir / "ssh" / "id_ed25519.pub").read_text().strip()
    return "\n".join(
        [
            f"dn: uid={name},ou=people,{SUFFIX}",
            "objectClass: inetOrgPerson",
            "objectClass: posixAccount",
            "objectClass: ldapPublicKey",
            f"uid: {name}",
            f"cn: {name}",
            f"sn: {name}",
            f"uidNumber: {uid}",
            f"gidNumber: {gid}",
            home or f"homeDirectory: /home/{name}",
            f"loginShell: {shell}",
            f"sshPublicKey: {key}",
            "",
        ]
    )


def posix_group(name: str, gid: int, *members: str) -> str:
    return "\n".join(
        [
            f"dn: cn={name},ou=groups,{SUFFIX}",
            "objectClass: posixGroup",
            f"cn: {name}",
            f"gidNumber: {gid}",
            *(f"memberUid: {m}" for m in members),
            "",
        ]
    )


SLURM_PODS = ("slonk-login-0", "slonk-cpu-0", "slonk-cpu-1", "slonk-controller-0")


def wait_on_every_pod(cluster: LocalCluster, name: str) -> None:
    """Each pod syncs on its own clock, every ldap.syncIntervalSeconds; with accounting, the
    controller's sync then gives the user a Slurm association, without which no job of theirs
    runs (AccountingStorageEnforce=associations)."""
    wait_for(
        f"{name} on every pod",
        lambda: all(cluster.pod(p).run(f"getent passwd {name}").rc == 0 for p in SLURM_PODS),
    )
    controller = cluster.pod("slonk-controller-0")
    if "accounting_storage/slurmdbd" not in controller.run("scontrol show config").stdout:
        return
    show = f"scontrol show assoc_mgr flags=assoc users={name}"
    wait_for(f"{name}'s association", lambda: f"UserName={name}(" in controller.run(show).stdout)


def wait_directory(cluster: LocalCluster) -> None:
    """Until the directory pod's slapd answers a search."""
    wait_for(
        "the directory",
        lambda: (
            cluster.pod("slonk-ldap-0")
            .run(f"ldapsearch -x -H ldap://localhost -b {SUFFIX} -s base")
            .rc
            == 0
        ),
    )
