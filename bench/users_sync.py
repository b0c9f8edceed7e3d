"""LDAP users sync at scale: 10,000 users and 2,000 groups from a real slapd. Prints JSON.

A full first sync (files, keys and 10,000 homes made), an unchanged re-sync (nothing is
rewritten), and a re-sync after one change. Slonk's public version syncs by a 15-minute
cron: a new user waits up to 15 minutes; here at most one interval plus one sync.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slonk.config.spec import Group, User
from slonk.pod.ldapdev import seed_ldif
from slonk.users.directory import read_directory
from slonk.users.sync import Paths, sync
from tests.integration.slapd import SUFFIX, running_slapd

USERS, GROUPS = 10_000, 2_000
PUBLIC_SLONK_CRON_SECONDS = 15 * 60
DEFAULT_INTERVAL_SECONDS = 60


def accounts() -> tuple[list[User], list[Group]]:
    groups = [Group(f"g{i:04d}", 20_000 + i) for i in range(GROUPS)]
    users = [
        User(
            name=f"u{i:05d}",
            uid=10_000 + i,
            gid=20_000 + i % GROUPS,
            groups=(groups[i % GROUPS].name, groups[(i * 7 + 3) % GROUPS].name),
            ssh_keys=(f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{i:032d} u{i:05d}@bench",),
        )
        for i in range(USERS)
    ]
    return users, groups


def timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return round(time.perf_counter() - started, 3), result


def main() -> None:
    users, groups = accounts()
    with tempfile.TemporaryDirectory(prefix="slonk-bench-users-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        with running_slapd(work / "slapd", seed_ldif(SUFFIX, users, groups)) as server:
            seed_s = round(time.perf_counter() - started, 3)
            spec = server.spec()
            etc, home = work / "etc", work / "home"
            etc.mkdir()
            home.mkdir()
            for name in ("passwd", "group", "shadow", "shells"):
                shutil.copy(f"/etc/{name}", etc / name)
            paths = Paths(etc=etc, home=home, var=work / "var")

            search_s, directory = timed(lambda: read_directory(spec.ldap))
            full_s, result = timed(lambda: sync(spec, paths))
            unchanged_s, _ = timed(lambda: sync(spec, paths))
            server.add(
                "\n".join(
                    [
                        f"dn: uid=newcomer,ou=people,{SUFFIX}",
                        "objectClass: inetOrgPerson",
                        "objectClass: posixAccount",
                        "uid: newcomer",
                        "cn: newcomer",
                        "sn: newcomer",
                        "uidNumber: 30000",
                        "gidNumber: 20000",
                        "homeDirectory: /home/newcomer",
                        "",
                    ]
                )
            )
            one_change_s, after = timed(lambda: sync(spec, paths))
        print(
            json.dumps(
                {
                    "benchmark": "users_sync",
                    "users": USERS,
                    "groups": GROUPS,
                    "slapd_seed_and_start_seconds": seed_s,
                    "ldap_search_seconds": search_s,
                    "entries_read": len(directory.users) + len(directory.groups),
                    "full_sync_seconds": full_s,
                    "users_written": len(result.users),
                    "unchanged_resync_seconds": unchanged_s,
                    "one_change_resync_seconds": one_change_s,
                    "users_after_change": len(after.users),
                    "passwd_bytes": (etc / "passwd").stat().st_size,
                    "new_user_worst_case_seconds": {
                        "public_slonk_cron": PUBLIC_SLONK_CRON_SECONDS,
                        "slonk_default_interval": round(DEFAULT_INTERVAL_SECONDS + one_change_s, 1),
                    },
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
