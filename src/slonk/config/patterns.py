"""The shapes a value may take where it reaches a config line, a command line or a URL.

One home for each rule: the spec parser matches with these, and values.schema.json carries
the same pattern strings (a setting's written from its rule by slonk.config.contract, the
rest held equal by tests/chart/test_contract.py). Each is written
in the subset of regular expressions Python's `re` and Go's RE2 (Helm's schema validator)
read alike, and always used whole (`re.fullmatch`): Python's `$` would accept a trailing
newline, which is exactly what an attacker wants on a config line.
"""

from __future__ import annotations

import re
from typing import Any

# Printable ASCII but the space, and none of what slurm.conf's parser reads specially:
# `#` starts a comment, `"` quotes, a trailing `\` joins the next line. So a value is one
# token and can add neither an option nor a line.
CONF_VALUE = r"^[!$-\[\]-~]+$"
CONF_KEY = r"^[A-Za-z][A-Za-z0-9]*$"
# An extraLines entry: a comment, or exactly one Key=Value (spaces around it are dropped).
EXTRA_LINE = r"^ *(#[ -~]*|[A-Za-z][A-Za-z0-9]*=[!$-\[\]-~]+)? *$"

# Names Slurm reads in node, partition, GRES and topology lines.
SLURM_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
# A name Slurm reads as its keyword for the defaults of the lines after it.
SLURM_DEFAULT = r"(?i)^default$"
# A DNS-1123 label: a Slurm node is a pod and a Service of the same name.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CLUSTER_NAME = r"^[a-z0-9_]{1,40}$"

# An LDAP search filter: one parenthesized filter (RFC 4515), as users sync passes it on.
LDAP_FILTER = r"^\(.*\)$"

# A Slurm account (sacctmgr lowercases names; `=`, `,` and spaces would be read as syntax).
ACCOUNT_NAME = r"^[a-z0-9_][a-z0-9_.-]{0,63}$"
# MariaDB database and user names, written into SQL and slurmdbd.conf: no quoting needed.
DATABASE_NAME = r"^[A-Za-z0-9_]{1,64}$"
DATABASE_USER = r"^[A-Za-z0-9_]{1,32}$"

# Partition settings slonk writes itself (MaxTime=, PreemptMode=, ...).
SLURM_TIME = r"^(INFINITE|UNLIMITED|[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(:[0-9]{1,2}){0,2})$"
# Fair share's decay half-life and a job's full age: days-hours, at least an hour and under
# ten years (Slurm refuses a zero half-life and dies on one that overflows).
PRIORITY_PERIOD = r"^(0-([1-9]|1[0-9]|2[0-3])|[1-9][0-9]{0,3}-([0-9]|1[0-9]|2[0-3]))$"
PREEMPT_MODE = r"^(OFF|CANCEL|GANG|REQUEUE|SUSPEND|WITHIN)(,(GANG|WITHIN))*$"

# An absolute path without `.` or `..` components, doubled or trailing slashes, spaces or
# shell syntax: health checks look at these paths as root.
ABSOLUTE_PATH = r"^(/[A-Za-z0-9_+@-][A-Za-z0-9._+@-]*)+$"
# A program health checks run as root, with its options, split on spaces and never read by a
# shell: `dmesg --kernel`. The program is a name looked up on PATH or an absolute path, never
# an option nor a path relative to wherever the check runs (an active check's Slurm job may
# start in /tmp, where users write).
COMMAND_LINE = (
    r"^(((/[A-Za-z0-9._+@-]+)+|[A-Za-z0-9_+@][A-Za-z0-9._+@-]*)( [A-Za-z0-9._/+@=,:-]+)*)?$"
)
# The longest value of a shape, where one is bounded (the schema says it as maxLength): a
# command line goes into every node's health plan and into the log lines naming it; a real
# one (`dcgmi diag -r 2`) is a few words.
MAX_LENGTH: dict[str, int] = {COMMAND_LINE: 512}
# Linux interface names (IFNAMSIZ: 15 characters) and RDMA device names.
INTERFACE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$"
RDMA_DEVICE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"

# What git-sync may be pointed at: https, ssh or git URLs, scp-like `user@host:path`, or a
# local file:// repository. Not `ext::` or other transports that run commands, and nothing
# git could read as an option.
GIT_REPO = (
    r"^((https|ssh|git|file)://[A-Za-z0-9._~:/?@+=%,-]+"
    r"|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[A-Za-z0-9._~/-]+)$"
)
# A branch, tag or commit: git's ref rules, and no leading `-`.
GIT_REF = r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$"
# A Kubernetes label key (or Node condition type): an optional DNS-name prefix and `/`, then a
# name of at most 63 characters.
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# An extended resource's name, as a device plugin registers it (nvidia.com/gpu): a DNS-name
# prefix, which Kubernetes requires of every resource outside its own, `/`, then a name.
EXTENDED_RESOURCE = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

# Any character below space, and DEL: no value slonk writes anywhere may hold one.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
# No number in values or cluster.yaml may be larger: Helm's `int` wraps bigger ones around
# (1e20 becomes a negative CPU count), `toYaml` writes them as 1e+21, which YAML reads back
# as a string, and Slurm keeps most counts in 32 bits.
LARGEST_NUMBER = 2**31 - 1


# Container image references (the distribution spec's grammar, without digests): a registry
# host[:port], a lower-case path, a tag. Local mode hands an image to podman's command line,
# where one starting with `-` would be read as an option.
_IMAGE_PATH = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
_IMAGE_HOST = r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?"
_IMAGE_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
IMAGE_REGISTRY = f"^({_IMAGE_HOST}(/{_IMAGE_PATH})?)?$"  # empty: the runtime's default
IMAGE_NAME = f"^{_IMAGE_PATH}$"
IMAGE_TAG = f"^({_IMAGE_TAG})?$"  # empty: the chart's appVersion
IMAGE = f"^({_IMAGE_HOST}/)?{_IMAGE_PATH}(:{_IMAGE_TAG})?$"
# Mail: an SMTP relay, host[:port], and MailDomain (empty: none); a mail address or a bare
# local part (the domain qualifies it), a dot-atom of the characters addresses use (an
# apostrophe included, as in o'neil; no %: some relays route a%b@c on to b), never a list, a
# display name or a quoted string. Each bounded by its shape (labels of at most 63
# characters, at most 8 of them; atoms of at most 64), as a config line and a header must
# be: Helm's regular expressions have no lookahead to bound a whole length.
_MAIL_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_MAIL_HOST = f"{_MAIL_LABEL}(\\.{_MAIL_LABEL}){{0,7}}"
_LOWER_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_MAIL_ATOM = r"[A-Za-z0-9'+_-]{1,64}"
MAIL_RELAY = f"^({_MAIL_HOST}(:[0-9]{{1,5}})?)?$"
MAIL_DOMAIN = f"^({_LOWER_LABEL}(\\.{_LOWER_LABEL}){{0,7}})?$"
MAIL_ADDRESS = f"^{_MAIL_ATOM}(\\.{_MAIL_ATOM}){{0,7}}(@{_MAIL_HOST})?$"


def matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def shape_error(pattern: str, value: str, what: str) -> str | None:
    """Why `value` is not of the shape (`what` names it), or None when it is."""
    longest = MAX_LENGTH.get(pattern)
    if longest is not None and len(value) > longest:
        return f"{what} of at most {longest} characters, not {len(value)}"
    return None if matches(pattern, value) else f"{value!r} is not {what}"


def first_unsafe_value(data: Any, path: str = "") -> tuple[str, str] | None:
    """The key path of the first string (key or value) holding a control character, or of
    the first number beyond +-LARGEST_NUMBER, anywhere in a parsed document, with what is
    wrong with it; None when there is none."""
    where = path or "<root>"
    if isinstance(data, str) and CONTROL_CHARACTERS.search(data):
        return where, f"{data!r} holds a control character (a newline, tab, ...)"
    number = isinstance(data, int | float) and not isinstance(data, bool)
    if number and not abs(data) <= LARGEST_NUMBER:  # NaN too
        return where, f"{data!r} is beyond {LARGEST_NUMBER}"
    if isinstance(data, dict):
        for key, value in data.items():
            at = f"{path}.{key}" if path else str(key)
            if found := first_unsafe_value(key, at) or first_unsafe_value(value, at):
                return found
    if isinstance(data, list):
        for i, item in enumerate(data):
            if found := first_unsafe_value(item, f"{path}[{i}]"):
                return found
    return None
