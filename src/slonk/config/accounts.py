"""What an account field may hold before it reaches passwd, group, shadow or sshd's keys.

One home for these rules: the spec parser applies them to static users (a SpecError naming
the key), the LDAP sync to directory entries (the entry is skipped with the reason), and the
chart's values.schema.json carries the same patterns (a unit test keeps them equal). Every
pattern is matched whole (re.fullmatch): Python's `$` also matches before a trailing newline.

The files are `:`-separated, one entry per line: a field holding `:`, a newline or any other
control character would write fields or lines of its own choosing (a second uid-0 line).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from slonk.config import patterns

# Debian's useradd rule (NAME_REGEX), at most 32 characters as glibc and Slurm expect.
NAME_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
# Absolute and normalised by construction (no `.`, `..`, empty or trailing components), and
# without `:` or spaces.
PATH_PATTERN = patterns.ABSOLUTE_PATH
PATH_MAX_CHARS = 4095
# One authorized_keys line: printable ASCII, so no newline can add a second key. Checked
# once surrounding whitespace is stripped (a pasted key's newline); the chart's schema
# allows that whitespace around the same pattern.
_KEY_BODY = r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?"
KEY_PATTERN = rf"^{_KEY_BODY}$"
KEY_SCHEMA_PATTERN = rf"^\s*{_KEY_BODY}\s*$"
KEY_MAX_CHARS = 16384

# uids and gids slonk may give: Debian's UID_MIN..UID_MAX by default (values: accounts).
MIN_ID = 1000
MAX_ID = 60000
# Bounds for the configured range: 0 is root; 2^31 and above overflow signed uid_t users.
ID_FLOOR = 1
ID_CEILING = 2**31 - 1
# Never given, whatever the range: they belong to accounts outside any image's passwd.
RESERVED_IDS = {
    65533: "git-sync's user (the hooks sidecar)",
    65534: "nobody",
    65535: "(uid_t)-1 on 16-bit systems",
}
# Never given: a user of that name would own the directory of the same name on /home.
RESERVED_NAMES = {"modulefiles": "the site's modulefiles (/home/modulefiles)"}
# The shared volume every Slurm pod mounts: default homes are made there.
HOME = "/home"
HOME_ROOTS = (HOME,)
# The site's scratch volume on login pods and workers (values scratch): each user's directory.
SCRATCH = "/scratch"
DEFAULT_SHELL = "/bin/bash"

_NAME = re.compile(NAME_PATTERN)
_PATH = re.compile(PATH_PATTERN)
_KEY = re.compile(KEY_PATTERN)


class AccountError(ValueError):
    """A value an account must not have; the message says which rule it breaks."""


def show(value: object) -> str:
    """A value for a log line or an error: untrusted text with its control characters
    escaped, so a message stays one line."""
    text = str(value)
    return text if text.isascii() and text.isprintable() else ascii(text)


def check_name(value: str, what: str = "name") -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise AccountError(
            f"{value!a} is not a valid {what} (lowercase letters, digits, '_' or '-', "
            "starting with a letter or '_', at most 32 characters)"
        )
    if value in RESERVED_NAMES:
        raise AccountError(f"{what} {value} is reserved for {RESERVED_NAMES[value]}")
    return value


def check_path(value: str, what: str) -> str:
    if not isinstance(value, str) or len(value) > PATH_MAX_CHARS or not _PATH.fullmatch(value):
        raise AccountError(
            f"{what} {show(value)} is not an absolute, normalised path of letters, digits and ._+@-"
        )
    return value


def check_shell(value: str, shells: Collection[str] | None = None) -> str:
    """A path; and on a pod, one of its /etc/shells (`shells`)."""
    check_path(value, "shell")
    if shells is not None and value not in shells:
        raise AccountError(f"shell {value} is not in /etc/shells")
    return value


def check_key(value: str) -> str:
    """One SSH public key line, surrounding whitespace removed."""
    key = value.strip() if isinstance(value, str) else value
    if not isinstance(key, str) or len(key) > KEY_MAX_CHARS or not _KEY.fullmatch(key):
        raise AccountError(
            f"SSH key {show(value)[:60]} is not one line of printable ASCII "
            f"(at most {KEY_MAX_CHARS} characters)"
        )
    return key


@dataclass(frozen=True)
class AccountRules:
    """The configurable part: the id range and where homes may be (values: accounts)."""

    min_id: int = MIN_ID
    max_id: int = MAX_ID
    home_roots: tuple[str, ...] = HOME_ROOTS

    def check_id(self, value: int, what: str = "id") -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise AccountError(f"{what} {show(value)} is not a number")
        if value in RESERVED_IDS:
            raise AccountError(f"{what} {value} is reserved for {RESERVED_IDS[value]}")
        if not self.min_id <= value <= self.max_id:
            raise AccountError(f"{what} {value} is outside {self.min_id}-{self.max_id}")
        return value

    def check_home(self, value: str) -> str:
        check_path(value, "home")
        if not any(value.startswith(f"{root}/") for root in self.home_roots):
            raise AccountError(f"home {value} is not under {' or '.join(self.home_roots)}")
        return value
