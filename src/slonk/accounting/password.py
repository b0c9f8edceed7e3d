"""The database password, from its Secret file (paths.ACCOUNTING_PASSWORD).

It is written on a slurmdbd.conf line (StoragePass=), so it is untrusted input there: one
printable token that slurmdbd's parser reads as it is, or the pod does not start.
"""

from __future__ import annotations

from pathlib import Path

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.config import patterns

MAX_LENGTH = 128


class PasswordError(SlonkError):
    """The password file is missing or holds what cannot be written on a config line."""


def check(password: str, where: str = str(paths.ACCOUNTING_PASSWORD)) -> str:
    """The password as it is, or PasswordError naming the file (never the password)."""
    if not password:
        raise PasswordError(f"{where}: empty; the Secret's key `password` must hold one")
    if len(password) > MAX_LENGTH:
        raise PasswordError(f"{where}: longer than {MAX_LENGTH} characters")
    # CONF_VALUE: printable ASCII but space, `#`, `"` and `\`: one token on a slurmdbd.conf
    # line, neither a comment nor a quote nor a continuation.
    if not patterns.matches(patterns.CONF_VALUE, password):
        raise PasswordError(
            f"{where}: the password must be printable ASCII without spaces, '#', '\"' or '\\' "
            "(slurmdbd.conf would read anything else as syntax)"
        )
    return password


def read(path: Path = paths.ACCOUNTING_PASSWORD) -> str:
    """The password in `path`; one trailing newline (`echo > file`) is dropped."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise PasswordError(
            f"{path}: no database password ({err.strerror}); mount the password Secret there"
        ) from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise PasswordError(f"{path}: the password is not ASCII") from None
    return check(text.removesuffix("\n"), str(path))
