"""Which hook revision is active: git-sync publishes, slonk checks, then activates or refuses.

git-sync swaps `<root>/<link>` to each new commit's worktree (and deletes the old one), so a
revision is first copied into slonk's own store, and the copy is what gets checked and run:
nothing can change it between the checks and a job. A revision that passes becomes active
by one rename of `active`. One that fails is refused with its reason and the last good one
stays active: a typo pushed to the hooks repository never reaches a job, and neither does a
script no job could run (a CRLF `#!` line, an interpreter the image lacks), which would
otherwise fail the prolog and drain every node it met.

The repository is untrusted input, and so is git-sync's volume: each phase's directory is
walked and copied without following a symlink (slonk.hooks.tree says what an entry may be),
and each script it runs must start and parse in this pod (slonk.hooks.scripts). Beside those:
- the copy is root's, files 0755 or 0644 whatever modes the checkout had, and the prolog's
  and epilog's directories root's alone (ROOT_ONLY_PHASES: hooks may carry a site's secrets;
  task prolog/epilog scripts run as the job's user, who must read them);
- the revision's whole checkout within REPO_BYTES_PER_FILE x maxFileBytes: git-sync fetches
  and checks out the whole commit, so a large file anywhere in the repository costs every
  worker its size twice (objects, checkout); such a revision is refused as a bad one (and,
  the size being the revision's, the next one without the file is not).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slonk.base import paths
from slonk.base.files import write_atomically
from slonk.config.spec import ClusterSpec, HookSettings, SpecError
from slonk.hooks.scripts import check_script
from slonk.hooks.tree import Refused, copy_entries, open_dir, open_phase, shown, walk

if TYPE_CHECKING:
    from slonk.agent.changes import Waiter

ACTIVE = "active"
STATUS = "status.json"
SETTINGS = "settings.json"
REPO_BYTES_PER_FILE = 16  # a revision's checkout, all of it, within 16 x maxFileBytes
MAX_REPO_ENTRIES = 100_000  # entries a revision's checkout may hold
# Phases whose scripts run as root (slurmd's Prolog/Epilog): their copies are root's alone.
ROOT_ONLY_PHASES = ("prolog", "epilog")
MAX_REPORTED = 20  # problems named in the status; the rest are counted
# Where inotify is unavailable: as often as before inotify.
POLL_SECONDS = 0.2
# git-sync names each worktree after its commit (SHA-1 or SHA-256).
REVISION = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def log(message: str) -> None:
    print(f"slonk hooks: {message}", file=sys.stderr, flush=True)


def _check_copy(folder: Path, shown_as: str, settings: HookSettings) -> tuple[list[str], list[str]]:
    """A phase's copy in slonk's store: what is wrong with it, and what was not checked."""
    fd = open_dir(folder)
    try:
        entries, found = walk(fd, shown_as, settings)
    finally:
        os.close(fd)
    unchecked = []
    for entry in entries:
        if "/" in entry.relative or entry.relative.startswith("."):
            continue  # helpers: never run by the dispatcher
        try:
            note = check_script(folder / entry.relative, entry)
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


def _stage(tree: Path, settings: HookSettings, staging: Path) -> tuple[list[str], list[str]]:
    """Copy each phase's directory to staging/<phase>; what the copy found wrong, and what
    it could not check."""
    found = []
    staging.mkdir(mode=0o755)
    try:
        tree_fd = open_dir(tree)
    except OSError as err:
        return [f"the tree cannot be opened ({err.strerror})"], []
    try:
        for phase, directory in settings.phases.items():
            try:
                folder = open_phase(tree_fd, directory)
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
                    copy_entries(folder, entries, staging / phase, settings.max_file_bytes, mode)
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
