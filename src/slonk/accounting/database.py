"""The chart's MariaDB (role `database`): made on its volume at first start, and at every
start told the database and user slurmdbd needs, with the password from the Secret file.

The password never reaches SQL: MariaDB is given its mysql_native_password hash, hex digits
that no password can turn into a statement. Names come from the spec's patterns (letters,
digits, `_`) and are checked again here, where they are written into SQL.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from slonk.accounting import password
from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.base.files import make_dir, write_atomically
from slonk.config import patterns
from slonk.config.model import Database

MYSQL_USER = "mysql"
# The data lives one level down the volume: a filesystem's lost+found at its root would be
# read by MariaDB as a database.
DATA_DIR = paths.DATABASE_DATA / "data"
CONF = Path("/etc/mysql/slonk.cnf")  # mariadbd --defaults-file: Debian's files are not read
INIT_SQL = Path("/run/slonk/database/init.sql")
RUN_DIR = Path("/run/mysqld")


class DatabaseError(SlonkError):
    """The database cannot be prepared; the message names what failed."""


def native_password_hash(secret: str) -> str:
    """MariaDB's mysql_native_password hash: '*' and the upper-case hex SHA1 of SHA1."""
    return "*" + hashlib.sha1(hashlib.sha1(secret.encode()).digest()).hexdigest().upper()


def init_sql(database: Database, password_hash: str) -> str:
    """What mariadbd runs at each start (init-file, one statement a line): the database and
    the user exist, with this password hash and every right on the database alone."""
    if not patterns.matches(patterns.DATABASE_NAME, database.name):
        raise DatabaseError(f"accounting.database.name {database.name!r}: not a database name")
    if not patterns.matches(patterns.DATABASE_USER, database.user):
        raise DatabaseError(f"accounting.database.user {database.user!r}: not a user name")
    if not (len(password_hash) == 41 and password_hash[0] == "*"):
        raise DatabaseError("not a mysql_native_password hash")
    int(password_hash[1:], 16)  # hex digits only, or ValueError
    account = f"'{database.user}'@'%'"
    return (
        "\n".join(
            [
                f"CREATE DATABASE IF NOT EXISTS `{database.name}`;",
                f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY PASSWORD '{password_hash}';",
                # The Secret may have been replaced: the password follows it at the next start.
                f"ALTER USER {account} IDENTIFIED BY PASSWORD '{password_hash}';",
                f"GRANT ALL PRIVILEGES ON `{database.name}`.* TO {account};",
            ]
        )
        + "\n"
    )


def server_config(database: Database) -> str:
    """mariadbd's whole configuration: on every address of the pod, names never resolved
    (clients are pods; a DNS outage must not lock slurmdbd out), logging to stderr."""
    return (
        "\n".join(
            [
                "# Written by slonk init --role database; changes are overwritten.",
                "[mariadbd]",
                f"datadir={DATA_DIR}",
                f"socket={RUN_DIR / 'mysqld.sock'}",
                f"pid-file={RUN_DIR / 'mysqld.pid'}",
                f"port={database.port}",
                "skip-name-resolve",
                f"init-file={INIT_SQL}",
                # What Slurm's accounting guide asks of InnoDB (its upgrades hold long locks).
                "innodb_lock_wait_timeout=900",
                "innodb_buffer_pool_size=256M",
                "innodb_log_file_size=64M",
            ]
        )
        + "\n"
    )


def install(data_dir: Path = DATA_DIR) -> bool:
    """Make MariaDB's system tables on the volume, once: into a new directory that becomes
    the data directory only when complete, so an interrupted first start starts over.
    True when it made them; a data directory that exists is never touched."""
    if data_dir.is_dir():
        return False
    make_dir(data_dir.parent, 0o755)
    fresh = data_dir.with_name(data_dir.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    make_dir(fresh, 0o700, owner=MYSQL_USER)
    done = subprocess.run(
        [
            "s6-setuidgid", MYSQL_USER, "mariadb-install-db", "--no-defaults",
            f"--datadir={fresh}", "--auth-root-authentication-method=socket",
            "--skip-test-db", "--skip-name-resolve",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
        raise DatabaseError(f"mariadb-install-db failed (exit {done.returncode}):\n{tail}")
    fresh.rename(data_dir)
    return True


def prepare(database: Database) -> str:
    """Everything mariadbd needs before s6 starts it."""
    secret = password.read()
    made = install()
    make_dir(RUN_DIR, 0o755, owner=MYSQL_USER)
    make_dir(INIT_SQL.parent, 0o700, owner=MYSQL_USER)
    write_atomically(INIT_SQL, init_sql(database, native_password_hash(secret)), 0o600, MYSQL_USER)
    write_atomically(CONF, server_config(database))
    what = "made the system tables" if made else "kept its data"
    return f"{what} in {DATA_DIR}; database {database.name}, user {database.user}"
