"""Which hook revision is active: git-sync publishes, slonk checks, then activates or refuses.

git-sync swaps `<root>/<link>` to each new commit's worktree (and deletes the old one), so a
revision is first copied into slonk's own store, and the copy is what gets checked and run:
nothing can change it between the checks and a job. A revision that passes becomes active
by one rename of `active`. One that fails is refused with its reason and the last good one
stays active: a typo pushed to the hooks repository never reaches a job, and neither does a
script no job could run (a CRLF `#!` line, an interpreter the image lacks), which would
otherwise fail the prolog and drain every node it met.

The repository is untrusted input. Copied and checked is every entry of each phase's
directory (helpers included), without following a symlink:
- names: UTF-8, no control characters, not starting with `-`;
- kinds: regular files, directories, and symlinks resolving inside the phase's directory to
  a file or directory; no FIFO, socket or device, no setuid or setgid bit;
- sizes: each file within maxFileBytes, the directory within TREE_BYTES_PER_FILE of them,
  MAX_ENTRIES entries, MAX_DEPTH levels;
- the copy is root's, files 0755 or 0644 whatever modes the checkout had;
- each script run (a phase directory's entries not starting with `.`): a regular executable
  file whose `#!` line names, by absolute path, an executable in this pod (`/usr/bin/env NAME`:
  NAME found on the jobs' PATH), and which passes its interpreter's syntax check.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slonk import paths
from slonk.config.spec import ClusterSpec, HookSettings, SpecError
from slonk.files import write_atomically
from slonk.services import idle

ACTIVE = "active"
STATUS = "status.json"
SETTINGS = "settings.json"
# A phase's scripts and their helpers are a handful of small files; these bound what a
# repository can make every node copy and check.
MAX_ENTRIES = 1000
MAX_DEPTH = 8
TREE_BYTES_PER_FILE = 8  # a phase directory holds at most 8 x maxFileBytes in all
# The kernel reads the `#!` line from the file's first 256 bytes (BINPRM_BUF_SIZE).
SHEBANG_BYTES = 256
MAX_REPORTED = 20  # problems named in the status; the rest are counted
SYNTAX_TIMEOUT_SECONDS = 30
# git-sync names each worktree after its commit (SHA-1 or SHA-256).
REVISION = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# C0, DEL and C1: what a terminal or Slurm's one-line output would act on.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SHELLS = ("sh", "bash", "dash")


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
    try:
        text.encode()
    except UnicodeEncodeError:
        raise Refused(f"{what} is not UTF-8") from None
    if CONTROL.search(text):
        raise Refused(f"{what} has a control character")


@dataclass(frozen=True)
class Entry:
    relative: str  # inside the phase directory
    kind: str  # "dir", "file" or "link"
    mode: int
    target: str = ""  # a link's


def _link_target(path: str, root: str) -> str:
    """A symlink's target, if it stays inside the phase directory `root` (real path)."""
    target = os.readlink(path)
    _check_text(target, "symlink target")
    real = os.path.realpath(path)
    if os.path.isabs(target) or (real != root and not real.startswith(root + os.sep)):
        raise Refused(f"symlink to {shown(target)} points outside its directory")
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise Refused(f"symlink to {shown(target)} points to nothing") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise Refused(f"symlink to {shown(target)} points to a special file")
    return target


def walk(folder: Path, shown_as: str, settings: HookSettings) -> tuple[list[Entry], list[str]]:
    """Every entry under a phase directory, never following a symlink, and what is wrong
    with them. Stops at the first limit a tree exceeds: a huge tree is not read to its end."""
    entries: list[Entry] = []
    found: list[str] = []
    root = os.path.realpath(folder)
    budget = settings.max_file_bytes * TREE_BYTES_PER_FILE
    total = seen = 0
    pending = [("", 0)]
    while pending:
        relative, depth = pending.pop()
        with os.scandir(os.path.join(folder, relative)) as listing:
            children = sorted(
                itertools.islice(listing, MAX_ENTRIES - seen + 1), key=lambda e: e.name
            )
        seen += len(children)
        if seen > MAX_ENTRIES:
            return entries, [*found, f"{shown_as}: more than {MAX_ENTRIES} entries"]
        for child in children:
            name = os.path.join(relative, child.name)
            try:
                _check_text(child.name, "name")
                if child.name.startswith("-"):
                    raise Refused("name starts with '-'")
                info = child.stat(follow_symlinks=False)
                if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    raise Refused("setuid or setgid bit")
                if stat.S_ISLNK(info.st_mode):
                    entries.append(Entry(name, "link", 0, _link_target(child.path, root)))
                elif stat.S_ISDIR(info.st_mode):
                    if depth >= MAX_DEPTH:
                        raise Refused(f"directories nested deeper than {MAX_DEPTH}")
                    entries.append(Entry(name, "dir", info.st_mode))
                    pending.append((name, depth + 1))
                elif stat.S_ISREG(info.st_mode):
                    if info.st_size > settings.max_file_bytes:
                        raise Refused(f"larger than {settings.max_file_bytes} bytes")
                    total += info.st_size
                    entries.append(Entry(name, "file", info.st_mode))
                else:
                    raise Refused("not a regular file, directory or symlink")
            except Refused as err:
                found.append(f"{shown_as}/{shown(name)}: {err}")
        if total > budget:
            return entries, [*found, f"{shown_as}: more than {budget} bytes in all"]
    return entries, found


def _phase_folder(tree: Path, directory: str) -> Path | None:
    """The phase's directory in the tree, None when the repository has none; refused when
    it is not a real directory there (a symlink on the way could lead anywhere)."""
    folder = tree / directory
    if not os.path.lexists(folder):
        return None
    expected = os.path.normpath(os.path.join(os.path.realpath(tree), directory))
    if not folder.is_dir() or os.path.realpath(folder) != expected:
        raise Refused("not a directory inside the repository")
    return folder


def interpreter(head: bytes, search_path: str = paths.DEFAULT_PATH) -> str:
    """The program the kernel would run a script with, from the script's first bytes, when
    it is there to run: raises Refused naming what is wrong otherwise. Checked here, in the
    pod the scripts run in, with the jobs' PATH."""
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
    if CONTROL.search(text.replace("\t", " ")):
        raise Refused(f"#! line has a control character: {shown(text)}")
    program, _, argument = text.strip(" \t").replace("\t", " ").partition(" ")
    argument = argument.strip(" ")
    _executable(program)
    if Path(program).name != "env":
        return program
    # The kernel hands env everything after its path as one argument; only `env -S` splits.
    words = argument[2:].split() if argument.startswith("-S") else [argument]
    if not words or not words[0] or words[0].startswith("-") or "=" in words[0]:
        raise Refused(f"#! env: name the program to run first: {argument!r}")
    if " " in words[0]:
        raise Refused(f"#! env is given {argument!r} as one name; split it with `env -S`")
    if "/" in words[0]:
        return _executable(words[0])
    found = shutil.which(words[0], path=search_path)
    if found is None:
        raise Refused(f"#! interpreter {words[0]} is not on the jobs' PATH ({search_path})")
    return found


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


def _syntax(script: Path, program: str) -> None:
    """A syntax check by the script's own kind of interpreter; raises Refused on a fault."""
    name = Path(program).name
    if name in SHELLS:
        try:
            result = subprocess.run(
                ["bash", "-n", script.name],
                cwd=script.parent,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=SYNTAX_TIMEOUT_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise Refused("the shell's syntax check timed out") from None
        if result.returncode:
            first = (result.stderr.strip().splitlines() or ["syntax error"])[0]
            raise Refused(shown(first.removeprefix(f"{script.name}: ")))
    elif name.startswith("python"):
        try:
            compile(script.read_bytes(), str(script), "exec")
        except SyntaxError as err:  # NUL bytes too, with no line (3.11.4+)
            raise Refused(f"line {err.lineno}: {err.msg}" if err.lineno else err.msg) from None
        except (ValueError, RecursionError, MemoryError) as err:  # older NUL bytes, nesting
            raise Refused(f"cannot be compiled: {err}") from None


def _check_script(path: Path, entry: Entry) -> None:
    if entry.kind != "file":
        raise Refused("not a regular file")
    if not entry.mode & 0o111:
        raise Refused("not executable")
    with open(path, "rb") as script:
        program = interpreter(script.read(SHEBANG_BYTES))
    _syntax(path, program)


def _check_phase(folder: Path, shown_as: str, settings: HookSettings) -> list[str]:
    entries, found = walk(folder, shown_as, settings)
    for entry in entries:
        if "/" in entry.relative or entry.relative.startswith("."):
            continue  # helpers: never run by the dispatcher
        try:
            _check_script(folder / entry.relative, entry)
        except Refused as err:
            found.append(f"{shown_as}/{shown(entry.relative)}: {err}")
    return found


def problems(tree: Path, settings: HookSettings) -> list[str]:
    """Why this tree must not run, one line per entry; empty when every check passes."""
    found = []
    for directory in settings.phases.values():
        try:
            folder = _phase_folder(tree, directory)
        except Refused as err:
            found.append(f"{directory}: {err}")
            continue
        if folder is not None:
            found += _check_phase(folder, directory, settings)
    return found


def _copy(folder: Path, entries: list[Entry], target: Path, max_bytes: int) -> None:
    """The walked entries into slonk's store: root's, with modes of its own. A file grown
    past `max_bytes` since the walk is copied one byte over, so the copy's check refuses it."""
    target.mkdir(mode=0o755)
    for entry in entries:
        source, copy = folder / entry.relative, target / entry.relative
        if entry.kind == "dir":
            copy.mkdir(mode=0o755)
        elif entry.kind == "link":
            copy.symlink_to(entry.target)
        else:
            # The entry may have changed since the walk: open it without following a link or
            # waiting on a FIFO, copy only a regular file, and no more than its size allows.
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as data:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise Refused(f"{shown(entry.relative)} changed while it was copied")
                mode = 0o755 if entry.mode & 0o111 else 0o644
                out_fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                with os.fdopen(out_fd, "wb") as out:
                    out.write(data.read(max_bytes + 1))


def _stage(tree: Path, settings: HookSettings, staging: Path) -> list[str]:
    """Copy each phase's directory to staging/<phase>; what the copy found wrong."""
    found = []
    staging.mkdir(mode=0o755)
    for phase, directory in settings.phases.items():
        try:
            folder = _phase_folder(tree, directory)
        except Refused as err:
            found.append(f"{directory}: {err}")
            continue
        if folder is None:
            continue
        try:
            entries, wrong = walk(folder, directory, settings)
            found += wrong
            if not wrong:
                _copy(folder, entries, staging / phase, settings.max_file_bytes)
        except Refused as err:
            found.append(f"{directory}/{err}")
        except OSError as err:
            found.append(f"{directory}: changed while it was copied ({err.strerror})")
    if found:
        return found
    # What runs is the copy: it is what gets checked.
    return [
        problem
        for phase, directory in settings.phases.items()
        if (staging / phase).exists()
        for problem in _check_phase(staging / phase, directory, settings)
    ]


def activate(staged: Path, revision: str, state: Path) -> None:
    """Keep the checked copy as the revision's, then point `active` at it."""
    store = staged.parent
    target = store / revision
    if target.exists():
        shutil.rmtree(staged)  # checked before, and running jobs may be reading it
    else:
        os.rename(staged, target)
    link = state / f".{ACTIVE}.new"
    link.unlink(missing_ok=True)
    link.symlink_to(f"revisions/{revision}")
    os.replace(link, state / ACTIVE)
    for old in store.iterdir():
        if old.name != revision:
            shutil.rmtree(old, ignore_errors=True)


def read_status(state: Path = paths.HOOKS_STATE) -> dict:
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
    if REVISION.fullmatch(revision):
        staging = store / f".{revision}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        found = _stage(tree, settings, staging)
    else:
        staging = None
        found = [f"{shown(revision)}: not a commit's worktree in git-sync's root"]
    if found:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        status["refused"] = {"revision": shown(revision), "reason": _summary(found), "at": now}
        log(
            f"refused revision {shown(revision)[:12]}, {_active(status)} stays active: "
            f"{status['refused']['reason']}"
        )
    else:
        activate(staging, revision, state)
        status["active"] = {"revision": revision, "since": now}
        status["refused"] = None
        log(f"activated revision {revision[:12]}")
    write_atomically(state / STATUS, json.dumps(status, indent=1) + "\n")
    return not found


def _active(status: dict) -> str:
    return status["active"]["revision"][:12] if status.get("active") else "no revision"


def write_settings(settings: HookSettings, state: Path = paths.HOOKS_STATE) -> None:
    """What the dispatcher needs, as JSON: it runs for every job and must not parse YAML."""
    state.mkdir(mode=0o755, parents=True, exist_ok=True)
    write_atomically(state / SETTINGS, json.dumps({"timeoutSeconds": settings.timeout_seconds}))


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
    root: Path = paths.GIT_ROOT,
    state: Path = paths.HOOKS_STATE,
    interval: float = 0.2,
) -> None:
    """Follow git-sync's link; consider each new revision once."""
    spec = load()
    if spec.hooks is None:
        idle("hooks are not configured", log)
    seen = None
    log(f"watching {root / spec.hooks.link}")
    while True:
        found = published(root, spec.hooks.link)
        if found and found[1] != seen and os.path.lexists(found[0]):
            # (A tree gone since the readlink was swapped away: the next look finds the new.)
            tree, revision = found
            try:
                spec = load()
            except SpecError as err:
                log(f"keeping the last good settings: {err}")
            if spec.hooks is None:
                idle("hooks were switched off; a restarted pod drops this service", log)
            write_settings(spec.hooks, state)
            consider(tree, revision, spec.hooks, state)
            seen = revision
        time.sleep(interval)
