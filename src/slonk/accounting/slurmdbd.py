"""slurmdbd's configuration, rendered at the slurmdbd pod's start from cluster.yaml and the
password file. slurmdbd refuses a slurmdbd.conf that is not SlurmUser's with mode 0600."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from slonk.accounting import password
from slonk.base import paths
from slonk.base.files import make_dir, write_atomically
from slonk.config.model import AccountingSettings
from slonk.config.render import JWT_AUTH

CONF = Path("/etc/slurm/slurmdbd.conf")
PID_DIR = Path("/run/slurmdbd")
SLURM_USER = "slurm"
# slurmdbd retries a database that does not answer only every 5 s, and listens only once
# it has one: waiting here for the port lets it start as soon as the database does.
DATABASE_WAIT_SECONDS = 30.0


def render(
    accounting: AccountingSettings, host: str, storage_pass: str, *, jwt: bool = False
) -> str:
    """slurmdbd.conf. Every value but the password comes from the spec's checked patterns
    (host names, ports, database name and user); the password passes password.check. With
    `jwt` (the REST API is on), users' tokens are taken too, verified with slurmctld's key."""
    db = accounting.database
    lines = [
        "# Written by slonk init --role slurmdbd from cluster.yaml; changes are overwritten.",
        "AuthType=auth/munge",
        *(
            [f"AuthAltTypes={JWT_AUTH}", f"AuthAltParameters=jwt_key={paths.JWT_KEY}"]
            if jwt
            else []
        ),
        # slurmdbd refuses to start unless DbdHost names the machine it runs on: the pod.
        f"DbdHost={host}",
        f"DbdPort={accounting.port}",
        f"SlurmUser={SLURM_USER}",
        f"PidFile={PID_DIR / 'slurmdbd.pid'}",
        # No LogFile: in the foreground (-D, under s6) slurmdbd logs to stderr, the pod's log.
        "StorageType=accounting_storage/mysql",
        f"StorageHost={db.host}",
        f"StoragePort={db.port}",
        f"StorageUser={db.user}",
        f"StorageLoc={db.name}",
        f"StoragePass={password.check(storage_pass)}",
    ]
    if db.tls:
        # The site's database over TLS, its certificate verified against the CA Secret.
        lines.append(f"StorageParameters=SSL_CA={paths.ACCOUNTING_CA}")
    return "\n".join(lines) + "\n"


def prepare(accounting: AccountingSettings, host: str, *, jwt: bool = False) -> str:
    """Write slurmdbd.conf (SlurmUser's, 0600: it holds the password) and its PID directory."""
    if accounting.database.tls and not paths.ACCOUNTING_CA.is_file():
        raise password.PasswordError(
            f"{paths.ACCOUNTING_CA}: no CA certificate; database.tls needs the CA Secret there"
        )
    text = render(accounting, host, password.read(), jwt=jwt)
    make_dir(CONF.parent, 0o755)
    write_atomically(CONF, text, mode=0o600, owner=SLURM_USER)
    make_dir(PID_DIR, 0o755, owner=SLURM_USER)
    db = accounting.database
    return f"wrote {CONF}: database {db.name} at {db.host}:{db.port}{' (TLS)' if db.tls else ''}"


def wait_for_database(
    accounting: AccountingSettings, timeout: float = DATABASE_WAIT_SECONDS
) -> str:
    """Until the database accepts a connection, for at most `timeout`; slurmdbd keeps trying
    after that on its own (a database down for long must not keep the pod from starting)."""
    db = accounting.database
    started = time.monotonic()
    while True:
        try:
            with socket.create_connection((db.host, db.port), timeout=1.0):
                return f"{db.host}:{db.port} answers ({time.monotonic() - started:.1f} s)"
        except OSError as err:
            if time.monotonic() - started >= timeout:
                return f"{db.host}:{db.port} does not answer ({err}); slurmdbd will keep trying"
            time.sleep(0.1)
