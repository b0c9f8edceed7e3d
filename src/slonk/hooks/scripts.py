"""Can a hook script start, and does it parse? Checked in the pod its jobs run in.

Each script run (a phase directory's entries not starting with `.`) must be a regular
executable file whose `#!` line names, by absolute path, an executable in this pod (`/usr/bin/env
NAME`: NAME found on the jobs' PATH). Shell and Python scripts must pass a syntax check by that
very interpreter with the `#!` line's arguments; scripts of other interpreters run unchecked,
and the status says so (`perl -c` would run BEGIN blocks: no check that runs nothing exists for
them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from slonk.base import paths
from slonk.hooks.tree import Entry, Refused, shown

# The kernel reads the `#!` line from the file's first 256 bytes (BINPRM_BUF_SIZE).
SHEBANG_BYTES = 256
SYNTAX_TIMEOUT_SECONDS = 30
# The kernel hands a `#!` line's interpreter the rest of the line as one argument.
SHEBANG = re.compile(r"[ \t]*([^ \t]*)[ \t]*(.*?)[ \t]*")
# What `env -S` would read other than words between blanks: the check could not know the
# command it makes.
ENV_SPECIAL = re.compile(r"[\\'\"$#]")
# Interpreters with a syntax check that runs nothing, and the `#!` arguments each may get.
# An argument must change how the script runs, never what is read: `bash --rcfile -n FILE`
# runs FILE, `-c`, `-s` and `-t` leave it unread, `-i` reads startup files, so these (and
# anything not listed) are refused rather than trusted to the check.
SHELLS = ("sh", "dash", "bash", "ksh", "ksh93", "mksh", "zsh")
SHELL_ARGUMENT = re.compile(r"[-+][abefhklmnpruvxBCEHPT]+|--(?:login|noprofile|norc|posix)")
PYTHON = re.compile(r"python[0-9.]*")
PYTHON_ARGUMENT = re.compile(r"-[BEIOPSbdqsuv]+")
# Run by the script's own Python, whatever its version (2.6 and later read this too).
PYTHON_CHECK = """import sys
path = sys.argv[1]
try:
    compile(open(path, 'rb').read(), path, 'exec')
except SyntaxError as err:
    sys.stderr.write('line %s: %s\\n' % (err.lineno, err.msg) if err.lineno else err.msg + '\\n')
    sys.exit(1)
except Exception as err:
    sys.stderr.write('cannot be compiled: %s\\n' % err)
    sys.exit(1)
"""
# Syntax checks run with what the jobs' hooks get from slurmd: no environment of the
# watcher's (BASH_ENV, PYTHONSTARTUP...) and messages in plain English.
CHECK_ENV = {"PATH": paths.DEFAULT_PATH, "LC_ALL": "C"}


def interpreter(head: bytes, search_path: str = paths.DEFAULT_PATH) -> list[str]:
    """The command the kernel (and env) would run a script with, from the script's first
    bytes: the interpreter's absolute path, then its arguments. Raises Refused naming what
    is wrong when the script could not start. Checked here, in the pod the scripts run in,
    with the jobs' PATH."""
    line, newline, _ = head[:SHEBANG_BYTES].partition(b"\n")
    if not line.startswith(b"#!"):
        raise Refused("no #! line")
    if not newline and len(head) >= SHEBANG_BYTES:
        raise Refused(f"#! line longer than {SHEBANG_BYTES - 1} bytes")
    if b"\r" in line:
        raise Refused("#! line ends in a carriage return (CRLF line ends?)")
    try:
        text = line[2:].decode()
    except UnicodeDecodeError:
        raise Refused("#! line is not UTF-8") from None
    if not text.replace("\t", " ").isprintable():
        raise Refused(f"#! line has a control character: {shown(text)}")
    program, argument = SHEBANG.fullmatch(text).groups()  # type: ignore[union-attr]
    _executable(program)
    if Path(program).name != "env":
        return [program, argument] if argument else [program]
    # The kernel hands env everything after its path as one argument; only `env -S` splits.
    if argument.startswith("-S"):
        if ENV_SPECIAL.search(argument):
            raise Refused(f"#! env -S with quotes, escapes, variables or comments: {argument!r}")
        words = argument[2:].split()
    else:
        words = [argument]
    if not words or not words[0] or words[0].startswith("-") or "=" in words[0]:
        raise Refused(f"#! env: name the program to run first: {argument!r}")
    if " " in words[0] or "\t" in words[0]:
        raise Refused(f"#! env is given {argument!r} as one name; split it with `env -S`")
    if "/" in words[0]:
        return [_executable(words[0]), *words[1:]]
    found = shutil.which(words[0], path=search_path)
    if found is None:
        raise Refused(f"#! interpreter {words[0]} is not on the jobs' PATH ({search_path})")
    return [found, *words[1:]]


def _executable(program: str) -> str:
    if not program:
        raise Refused("#! line names no interpreter")
    if not program.startswith("/"):
        raise Refused(f"#! interpreter {program} is not an absolute path")
    if not os.path.exists(program):
        raise Refused(f"#! interpreter {program} does not exist in this image")
    if not os.path.isfile(program) or not os.access(program, os.X_OK):
        raise Refused(f"#! interpreter {program} is not an executable file")
    return program


def _syntax(script: Path, command: list[str]) -> str | None:
    """A syntax check by the interpreter the script runs with, given the `#!` line's
    arguments (a dash script in bash syntax, an option the shell lacks, fail here as on every
    node). Raises Refused on a fault; returns a note when the script's kind has no check."""
    kind = Path(command[0]).name
    if kind in SHELLS:
        allowed, check = SHELL_ARGUMENT, ["-n"]
    elif PYTHON.fullmatch(kind):
        allowed, check = PYTHON_ARGUMENT, ["-c", PYTHON_CHECK]
    else:
        return f"syntax not checked: {kind} has no check that runs nothing"
    for argument in command[1:]:
        if not allowed.fullmatch(argument):
            raise Refused(f"#! argument {argument!r}: not one {kind}'s syntax check can vouch for")
    path = os.path.abspath(script)  # absolute: never read as an option
    try:
        result = subprocess.run(
            [*command, *check, path],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            cwd="/",
            env=CHECK_ENV,
            timeout=SYNTAX_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Refused(f"{kind}'s syntax check timed out") from None
    except OSError as err:
        raise Refused(f"{kind}'s syntax check could not start: {err.strerror}") from None
    if result.returncode:
        lines = [line for line in result.stderr.split("\n") if line.strip()]
        # The error about the script itself, not a line `-v` echoed before it.
        about = [line for line in lines if line.startswith(f"{path}: ")] or lines
        first = about[0] if about else f"{kind}'s syntax check failed ({result.returncode})"
        raise Refused(shown(first.removeprefix(f"{path}: ")))
    return None


def check_script(path: Path, entry: Entry) -> str | None:
    """Why the walked `entry` at `path` could not run as a script (Refused), or a note when
    its syntax could not be checked."""
    if entry.kind != "file":
        raise Refused("not a regular file")
    if not entry.mode & 0o111:
        raise Refused("not executable")
    with open(path, "rb") as script:
        command = interpreter(script.read(SHEBANG_BYTES))
    return _syntax(path, command)
