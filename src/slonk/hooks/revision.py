"""Which hook revision is active: git-sync publishes, slonk checks, then activates or refuses.

git-sync swaps `<root>/<link>` to each new commit's worktree (and deletes the old one), so
a revision that passes the checks is copied into slonk's own store and `active` is swapped
to it in one rename. A revision that fails is refused with its reason and the last good one
stays active: a typo pushed to the hooks repository never reaches a job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from slonk import paths
from slonk.config.spec import ClusterSpec, HookSettings, SpecError
from slonk.files import write_atomically
from slonk.services import idle

ACTIVE = "active"
STATUS = "status.json"
SETTINGS = "settings.json"


def log(message: str) -> None:
    print(f"slonk hooks: {message}", file=sys.stderr, flush=True)


def _syntax(script: Path, interpreter: str) -> str | None:
    """A syntax check by the script's own kind of interpreter; None when it passes."""
    name = Path(interpreter.split()[0]).name
    if name == "env" and len(interpreter.split()) > 1:
        name = interpreter.split()[1]
    if name in ("sh", "bash", "dash"):
        result = subprocess.run(
            ["bash", "-n", script.name],
            cwd=script.parent,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode:
            return result.stderr.strip().splitlines()[0].removeprefix(f"{script.name}: ")
    if name.startswith("python"):
        try:
            compile(script.read_bytes(), str(script), "exec")
        except SyntaxError as err:
            return f"line {err.lineno}: {err.msg}"
    return None


def problems(tree: Path, settings: HookSettings) -> list[str]:
    """Why this tree must not run, one line per script; empty when every check passes."""
    found = []
    for directory in settings.phases.values():
        folder = tree / directory
        if not folder.exists():
            continue
        if not folder.is_dir() or folder.is_symlink():
            found.append(f"{directory}: not a directory")
            continue
        for script in sorted(folder.iterdir()):
            name = f"{directory}/{script.name}"
            if script.name.startswith("."):
                continue
            if script.is_symlink() or not script.is_file():
                found.append(f"{name}: not a regular file")
            elif script.stat().st_size > settings.max_file_bytes:
                found.append(f"{name}: larger than {settings.max_file_bytes} bytes")
            elif not os.access(script, os.X_OK):
                found.append(f"{name}: not executable")
            else:
                first = script.read_bytes()[:256].split(b"\n", 1)[0]
                if not first.startswith(b"#!"):
                    found.append(f"{name}: no #! line")
                elif error := _syntax(script, first[2:].decode(errors="replace").strip()):
                    found.append(f"{name}: {error}")
    return found


def activate(tree: Path, revision: str, settings: HookSettings, state: Path) -> None:
    """Copy the phases' directories into the store, then point `active` at them."""
    store = state / "revisions"
    target = store / revision
    if not target.exists():
        staging = store / f".{revision}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for phase, directory in settings.phases.items():
            if (tree / directory).is_dir():
                shutil.copytree(tree / directory, staging / phase, symlinks=True)
        os.rename(staging, target)
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


def consider(tree: Path, revision: str, settings: HookSettings, state: Path) -> bool:
    """Activate the revision if it passes the checks, else refuse it; True when activated."""
    status = read_status(state)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    found = problems(tree, settings)
    if found:
        status["refused"] = {"revision": revision, "reason": "; ".join(found), "at": now}
        log(
            f"refused revision {revision[:12]}, {_active(status)} stays active: "
            f"{status['refused']['reason']}"
        )
    else:
        activate(tree, revision, settings, state)
        status["active"] = {"revision": revision, "since": now}
        status["refused"] = None
        log(f"activated revision {revision[:12]}")
    write_atomically(state / STATUS, json.dumps(status, indent=1) + "\n")
    return not found


def _active(status: dict) -> str:
    return status["active"]["revision"][:12] if status.get("active") else "no revision"


def write_settings(settings: HookSettings, state: Path = paths.HOOKS_STATE) -> None:
    """What the dispatcher needs, as JSON: it runs for every job and must not parse YAML."""
    state.mkdir(parents=True, exist_ok=True)
    write_atomically(state / SETTINGS, json.dumps({"timeoutSeconds": settings.timeout_seconds}))


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
        link = root / spec.hooks.link
        # One readlink for both name and tree: git-sync may swap the link at any moment.
        target = root / os.readlink(link) if link.is_symlink() else None
        revision = target.name if target else None
        if target and revision != seen:
            try:
                spec = load()
            except SpecError as err:
                log(f"keeping the last good settings: {err}")
            if spec.hooks is None:
                idle("hooks were switched off; a restarted pod drops this service", log)
            write_settings(spec.hooks, state)
            consider(target, revision, spec.hooks, state)
            seen = revision
        time.sleep(interval)
