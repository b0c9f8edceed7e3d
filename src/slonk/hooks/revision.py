"""Which hook revision is active: git-sync publishes, slonk checks, then activates or refuses.

git-sync swaps `<root>/<link>` to each new commit's worktree (and deletes the old one), so a
revision is first copied into slonk's own store, and the copy is what gets checked and run:
nothing can change it between the checks and a job. A revision that passes becomes active
by one rename of `active`. One that fails is refused with its reason and the last good one
stays active: a typo pushed to the hooks repository never reaches a job, and neither does a
script no job could run (a CRLF `#!` line, an interpreter the image lacks), which would
otherwise fail the prolog and drain every node it met.

The repository is untrusted input, and so is git-sync's volume: whatever can write there may
swap an entry at any moment. Copied and checked is every entry of each phase's directory
(helpers included), each opened from its parent directory's descriptor without following a
symlink, and copied only if it is the very file or directory the walk saw:
- names: printable ASCII (they reach Slurm's drain reasons, logs and the status, where a
  U+2028 or a NEL ends a line), not starting with `-` or `+` (a program's options);
- kinds: regular files with one link, directories, and symlinks resolving inside the phase's
  directory to a file or directory; no FIFO, socket or device, no setuid or setgid bit;
- sizes: each file within maxFileBytes, the directory within TREE_BYTES_PER_FILE of them,
  MAX_ENTRIES entries, MAX_DEPTH levels;
- the copy is root's, files 0755 or 0644 whatever modes the checkout had, and the prolog's
  and epilog's directories root's alone (ROOT_ONLY_PHASES: hooks may carry a site's secrets;
  task prolog/epilog scripts run as the job's user, who must read them);
- the revision's whole checkout within REPO_BYTES_PER_FILE x maxFileBytes: git-sync fetches
  and checks out the whole commit, so a large file anywhere in the repository costs every
  worker its size twice (objects, checkout); such a revision is refused as a bad one (and,
  the size being the revision's, the next one without the file is not);
- each script run (a phase directory's entries not starting with `.`): a regular executable
  file whose `#!` line names, by absolute path, an executable in this pod (`/usr/bin/env NAME`:
  NAME found on the jobs' PATH). Shell and Python scripts must pass a syntax check by that
  very interpreter with the `#!` line's arguments; scripts of other interpreters run
  unchecked, and the status says so (`perl -c` would run BEGIN blocks: no check that
  runs nothing exists for them).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slonk.base import paths
from slonk.base.files import write_atomically
from slonk.config.spec import ClusterSpec, HookSettings, SpecError

if TYPE_CHECKING:
    from slonk.agent.changes import Waiter

ACTIVE = "active"
STATUS = "status.json"
SETTINGS = "settings.json"
# A phase's scripts and their helpers are a handful of small files; these bound what a
# repository can make every node copy and check.
MAX_ENTRIES = 1000
MAX_DEPTH = 8
TREE_BYTES_PER_FILE = 8  # a phase directory holds at most 8 x maxFileBytes in all
REPO_BYTES_PER_FILE = 16  # a revision's checkout, all of it, within 16 x maxFileBytes
MAX_REPO_ENTRIES = 100_000  # entries a revision's checkout may hold
# Phases whose scripts run as root (slurmd's Prolog/Epilog): their copies are root's alone.
ROOT_ONLY_PHASES = ("prolog", "epilog")
# The kernel reads the `#!` line from the file's first 256 bytes (BINPRM_BUF_SIZE).
SHEBANG_BYTES = 256
MAX_REPORTED = 20  # problems named in the status; the rest are counted
SYNTAX_TIMEOUT_SECONDS = 30
# Where inotify is unavailable: as often as before inotify.
POLL_SECONDS = 0.2
# git-sync names each worktree after its commit (SHA-1 or SHA-256).
REVISION = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# What a name (or a symlink's target) in a hook tree may hold.
PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")
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


def log(message: str) -> None:
    print(f"slonk hooks: {message}", file=sys.stderr, flush=True)


class Refused(Exception):
    """Why an entry or a script may not run."""


def shown(text: str) -> str:
    """`text` as it may be printed: control characters and undecodable bytes escaped."""
    out = []
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def _check_text(text: str, what: str) -> None:
    """Names reach Slurm's drain reasons, the log and the status: each must stay one line
    wherever it goes (Python's splitlines() ends lines at U+2028, NEL, FS, VT...)."""
    if not PRINTABLE_ASCII.fullmatch(text):
        raise Refused(f"{what} is not printable ASCII")


@dataclass(frozen=True)
class Entry:
    relative: str  # inside the phase directory
    kind: str  # "dir", "file" or "link"
    mode: int
    target: str = ""  # a link's
    identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) as walked: what the copy takes


def _open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """A directory, never through a symlink. O_NOFOLLOW guards the last component only: a
    path inside an untrusted tree is opened one component at a time, from its parent."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=dir_fd)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _link_target(dir_fd: int, name: str, root: str) -> str:
    """A symlink's target, if it stays inside the phase directory `root` (real path)."""
    target = os.readlink(name, dir_fd=dir_fd)
    _check_text(target, "symlink target")
    real = os.path.realpath(f"/proc/self/fd/{dir_fd}/{name}")
    if os.path.isabs(target) or (real != root and not real.startswith(root + os.sep)):
        raise Refused(f"symlink to {shown(target)} points outside its directory")
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise Refused(f"symlink to {shown(target)} points to nothing") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise Refused(f"symlink to {shown(target)} points to a special file")
    return target


def walk(folder: int, shown_as: str, settings: HookSettings) -> tuple[list[Entry], list[str]]:
    """Every entry under a phase directory (an open descriptor), depth first, never
    following a symlink, and what is wrong with them. Stops at the first limit a tree
    exceeds: a huge tree is not read to its end."""
    entries: list[Entry] = []
    found: list[str] = []
    root = os.path.realpath(f"/proc/self/fd/{folder}")
    budget = settings.max_file_bytes * TREE_BYTES_PER_FILE
    total = seen = 0

    def scan(fd: int, relative: str, depth: int) -> str | None:
        """The directory's entries; a limit exceeded, if one was."""
        nonlocal total, seen
        with os.scandir(fd) as listing:
            children = sorted(
                itertools.islice(listing, MAX_ENTRIES - seen + 1), key=lambda e: e.name
            )
        seen += len(children)
        if seen > MAX_ENTRIES:
            return f"more than {MAX_ENTRIES} entries"
        for child in children:
            name = os.path.join(relative, child.name)
            try:
                _check_text(child.name, "name")
                if child.name[0] in "-+":
                    raise Refused(f"name starts with '{child.name[0]}'")
                info = child.stat(follow_symlinks=False)
                if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    raise Refused("setuid or setgid bit")
                if stat.S_ISLNK(info.st_mode):
                    entries.append(Entry(name, "link", 0, _link_target(fd, child.name, root)))
                elif stat.S_ISDIR(info.st_mode):
                    if depth >= MAX_DEPTH:
                        raise Refused(f"directories nested deeper than {MAX_DEPTH}")
                    entries.append(Entry(name, "dir", info.st_mode, identity=_identity(info)))
                    inner = _open_dir(child.name, fd)
                    try:
                        if _identity(os.fstat(inner)) != _identity(info):
                            raise Refused("changed while it was walked")
                        exceeded = scan(inner, name, depth + 1)
                    finally:
                        os.close(inner)
                    if exceeded:
                        return exceeded
                elif stat.S_ISREG(info.st_mode):
                    if info.st_size > settings.max_file_bytes:
                        raise Refused(f"larger than {settings.max_file_bytes} bytes")
                    if info.st_nlink > 1:  # git checks out files, never links them
                        raise Refused("a hard link")
                    total += info.st_size
                    entries.append(Entry(name, "file", info.st_mode, identity=_identity(info)))
                else:
                    raise Refused("not a regular file, directory or symlink")
            except Refused as err:
                found.append(f"{shown_as}/{shown(name)}: {err}")
        if total > budget:
            return f"more than {budget} bytes in all"
        return None

    exceeded = scan(folder, "", 0)
    return entries, [*found, f"{shown_as}: {exceeded}"] if exceeded else found


def _open_phase(tree: int, directory: str) -> int | None:
    """The phase's directory in the tree, opened component by component: None when the
    repository has none; refused when it is not a real directory there (a symlink on the
    way could lead anywhere)."""
    fd = os.dup(tree)
    try:
        for part in directory.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise Refused("not a directory inside the repository")
            try:
                inner = _open_dir(part, fd)
            except FileNotFoundError:
                return None
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, a file
                    raise Refused("not a directory inside the repository") from None
                raise Refused(f"cannot be opened ({err.strerror})") from None
            os.close(fd)
            fd = inner
        opened, fd = fd, -1
        return opened
    finally:
        if fd >= 0:
            os.close(fd)


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


def _check_script(path: Path, entry: Entry) -> str | None:
    if entry.kind != "file":
        raise Refused("not a regular file")
    if not entry.mode & 0o111:
        raise Refused("not executable")
    with open(path, "rb") as script:
        command = interpreter(script.read(SHEBANG_BYTES))
    return _syntax(path, command)


def _check_copy(folder: Path, shown_as: str, settings: HookSettings) -> tuple[list[str], list[str]]:
    """A phase's copy in slonk's store: what is wrong with it, and what was not checked."""
    fd = _open_dir(folder)
    try:
        entries, found = walk(fd, shown_as, settings)
    finally:
        os.close(fd)
    unchecked = []
    for entry in entries:
        if "/" in entry.relative or entry.relative.startswith("."):
            continue  # helpers: never run by the dispatcher
        try:
            note = _check_script(folder / entry.relative, entry)
        except Refused as err:
            found.append(f"{shown_as}/{shown(entry.relative)}: {err}")
        else:
            if note:
                unchecked.append(f"{shown_as}/{entry.relative}: {note}")
    return found, unchecked


def problems(tree: Path, settings: HookSettings) -> list[str]:
    """Why this tree must not run, one line per entry; empty when every check passes. The
    checks a revision gets: a copy made and checked, then thrown away."""
    with tempfile.TemporaryDirectory() as scratch:
        return _stage(tree, settings, Path(scratch) / "staging")[0]


def _copy(
    folder: int, entries: list[Entry], target: Path, max_bytes: int, mode: int = 0o755
) -> None:
    """The walked entries into slonk's store: root's, with modes of its own. Each is opened
    from its parent's descriptor without following a symlink, and copied only if it is what
    the walk saw (st_dev, st_ino): a directory swapped for a symlink to a root-only one since
    the walk cannot lead the copy out of the tree. A file grown past `max_bytes` since the
    walk is copied one byte over, so the copy's check refuses it. `target` gets `mode`."""
    target.mkdir(mode=mode)
    os.chmod(target, mode)  # whatever the umask
    opened = [("", folder)]  # the directories down to the current entry; walk is depth first
    try:
        for entry in entries:
            parent, _, name = entry.relative.rpartition("/")
            while len(opened) > 1 and opened[-1][0] != parent:
                os.close(opened.pop()[1])
            if opened[-1][0] != parent:
                raise Refused(f"{shown(entry.relative)}: not after its directory")
            copy = target / entry.relative
            if entry.kind == "link":
                copy.symlink_to(entry.target)
                continue
            # Not waiting on a FIFO swapped in: O_NONBLOCK; it is then refused as not the same.
            kind = os.O_DIRECTORY if entry.kind == "dir" else os.O_NONBLOCK
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | kind
            fd = os.open(name, flags, dir_fd=opened[-1][1])
            info = os.fstat(fd)
            if _identity(info) != entry.identity or (
                entry.kind == "file" and (not stat.S_ISREG(info.st_mode) or info.st_nlink > 1)
            ):
                os.close(fd)
                raise Refused(f"{shown(entry.relative)} changed while it was copied")
            if entry.kind == "dir":
                opened.append((entry.relative, fd))
                copy.mkdir(mode=0o755)
                continue
            with os.fdopen(fd, "rb") as data:
                mode = 0o755 if entry.mode & 0o111 else 0o644
                out_fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                with os.fdopen(out_fd, "wb") as out:
                    out.write(data.read(max_bytes + 1))
    finally:
        for _, fd in opened[1:]:
            os.close(fd)


def _stage(tree: Path, settings: HookSettings, staging: Path) -> tuple[list[str], list[str]]:
    """Copy each phase's directory to staging/<phase>; what the copy found wrong, and what
    it could not check."""
    found = []
    staging.mkdir(mode=0o755)
    try:
        tree_fd = _open_dir(tree)
    except OSError as err:
        return [f"the tree cannot be opened ({err.strerror})"], []
    try:
        for phase, directory in settings.phases.items():
            try:
                folder = _open_phase(tree_fd, directory)
            except Refused as err:
                found.append(f"{directory}: {err}")
                continue
            if folder is None:
                continue
            try:
                entries, wrong = walk(folder, directory, settings)
                found += wrong
                if not wrong:
                    mode = 0o700 if phase in ROOT_ONLY_PHASES else 0o755
                    _copy(folder, entries, staging / phase, settings.max_file_bytes, mode)
            except Refused as err:
                found.append(f"{directory}/{err}")
            except OSError as err:
                found.append(f"{directory}: changed while it was copied ({err.strerror})")
            finally:
                os.close(folder)
        if os.fstat(tree_fd).st_nlink == 0:  # git-sync deleted it: phases may be missing
            found.append("the tree was removed while it was copied")
    finally:
        os.close(tree_fd)
    if found:
        return found, []
    # What runs is the copy: it is what gets checked.
    unchecked = []
    for phase, directory in settings.phases.items():
        if (staging / phase).exists():
            wrong, notes = _check_copy(staging / phase, directory, settings)
            found += wrong
            unchecked += notes
    return found, unchecked


def activate(staged: Path, revision: str, state: Path) -> None:
    """Keep the checked copy as the revision's, then point `active` at it."""
    store = staged.parent
    target = store / revision
    if target.exists():
        shutil.rmtree(staged)  # checked before, and running jobs may be reading it
        _close(target)  # an older slonk's copy
    else:
        os.rename(staged, target)
    link = state / f".{ACTIVE}.new"
    link.unlink(missing_ok=True)
    link.symlink_to(f"revisions/{revision}")
    os.replace(link, state / ACTIVE)
    for old in store.iterdir():
        if old.name != revision:
            shutil.rmtree(old, ignore_errors=True)


def _close(tree: Path) -> None:
    """The root-only phases of a stored revision made root's alone."""
    for phase in ROOT_ONLY_PHASES:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tree / phase, 0o700)


def oversized(tree: Path, settings: HookSettings) -> str | None:
    """What is wrong with the size of a revision's whole checkout (not only the hook
    directories), or None: counted without following a symlink, and only up to the bound."""
    limit = settings.max_file_bytes * REPO_BYTES_PER_FILE
    total = entries = 0
    todo = [str(tree)]
    while todo:
        try:
            listing = os.scandir(todo.pop())
        except OSError:
            continue  # git-sync removed it meanwhile
        with listing:
            for entry in listing:
                entries += 1
                if entries > MAX_REPO_ENTRIES:
                    return f"the checkout holds more than {MAX_REPO_ENTRIES} entries"
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    todo.append(entry.path)
                    continue
                total += info.st_size
                if total > limit:
                    return (
                        f"the checkout is larger than {limit} bytes ({REPO_BYTES_PER_FILE} x "
                        "maxFileBytes; every worker keeps it twice): keep only hooks in the "
                        "repository"
                    )
    return None


def read_status(state: Path = paths.HOOKS_STATE) -> dict[str, Any]:
    try:
        return json.loads((state / STATUS).read_text())
    except (OSError, ValueError):
        return {"active": None, "refused": None}


def _summary(found: list[str]) -> str:
    more = len(found) - MAX_REPORTED
    return "; ".join(found[:MAX_REPORTED]) + (f"; and {more} more" if more > 0 else "")


def consider(tree: Path, revision: str, settings: HookSettings, state: Path) -> bool:
    """Activate the revision if it passes the checks, else refuse it; True when activated."""
    status = read_status(state)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    store = state / "revisions"
    store.mkdir(mode=0o755, parents=True, exist_ok=True)
    unchecked: list[str] = []
    if not REVISION.fullmatch(revision):
        staging = None
        found = [f"{shown(revision)}: not a commit's worktree in git-sync's root"]
    elif too_big := oversized(tree, settings):
        staging, found = None, [too_big]
    else:
        staging = store / f".{revision}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        found, unchecked = _stage(tree, settings, staging)
    if staging is not None and not found:
        activate(staging, revision, state)
        status["active"] = {"revision": revision, "since": now, "unchecked": unchecked}
        status["refused"] = None
        log(f"activated revision {revision[:12]}")
        if unchecked:
            log(f"revision {revision[:12]}: {_summary(unchecked)}")
    else:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        status["refused"] = {"revision": shown(revision), "reason": _summary(found), "at": now}
        log(
            f"refused revision {shown(revision)[:12]}, {_active(status)} stays active: "
            f"{status['refused']['reason']}"
        )
    write_atomically(state / STATUS, json.dumps(status, indent=1) + "\n")
    return not found


def _active(status: dict[str, Any]) -> str:
    return status["active"]["revision"][:12] if status.get("active") else "no revision"


def write_settings(settings: HookSettings, state: Path = paths.HOOKS_STATE) -> None:
    """What the dispatcher needs, as JSON: it runs for every job and must not parse YAML."""
    state.mkdir(mode=0o755, parents=True, exist_ok=True)
    written = {
        "timeoutSeconds": settings.timeout_seconds,
        "phaseTimeoutSeconds": settings.phase_timeout_seconds,
    }
    write_atomically(state / SETTINGS, json.dumps(written))


def published(root: Path, link: str) -> tuple[Path, str] | None:
    """The tree git-sync's link points at and its name, with one readlink (git-sync may swap
    the link at any moment); a link leading out of git-sync's root names no tree there."""
    try:
        pointed = os.readlink(root / link)
    except OSError:
        return None
    tree = root / pointed
    inside = os.path.realpath(tree).startswith(os.path.realpath(root) + os.sep)
    # Outside, the whole target is its name: no commit id, so it is refused as one.
    return tree, tree.name if inside else pointed


def watch(
    load: Callable[[], ClusterSpec],
    stop: threading.Event,
    changes: Waiter,
    root: Path = paths.GIT_ROOT,
    state: Path = paths.HOOKS_STATE,
) -> None:
    """Follow git-sync's link (`changes` wakes on its root directory, where git-sync renames
    the link); consider each new revision once. Until `stop` is set or hooks are switched off."""
    spec = load()
    if spec.hooks is None:
        log("hooks are not configured")
        return
    hooks = spec.hooks
    seen = None
    log(f"watching {root / hooks.link}: {changes.describe()}")
    while not stop.is_set():
        found = published(root, hooks.link)
        if found and found[1] != seen and os.path.lexists(found[0]):
            # (A tree gone since the readlink was swapped away: the next look finds the new.)
            tree, revision = found
            try:
                spec = load()
            except SpecError as err:
                log(f"keeping the last good settings: {err}")
            if spec.hooks is None:
                log("hooks were switched off; a restarted pod runs no hooks watch")
                return
            hooks = spec.hooks
            write_settings(hooks, state)
            consider(tree, revision, hooks, state)
            seen = revision
        changes.wait()
