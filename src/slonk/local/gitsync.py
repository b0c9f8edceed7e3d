"""LOCAL MODE ONLY: a stand-in for the git-sync sidecar, whose image cannot run here.

It honours git-sync v4's on-disk contract, which is all slonk relies on: under GITSYNC_ROOT,
each fetched commit gets a worktree in `.worktrees/<commit>`, and GITSYNC_LINK is a relative
symlink swapped to the new worktree in one rename, after which the old worktree is removed.
It reads the same GITSYNC_* variables as the real sidecar (REPO, REF, PERIOD, DEPTH, ROOT,
LINK) and uses real git. On Kubernetes the chart runs git-sync itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def sync_once(repo: str, ref: str, root: Path, link: str, depth: int) -> str | None:
    """Fetch `ref`; publish its commit if new. Returns the commit published, or None."""
    if not (root / ".git").exists():
        root.mkdir(parents=True, exist_ok=True)
        _git(root, "init", "--quiet")
    fetch = [
        "fetch",
        "--quiet",
        "--no-tags",
        *(["--depth", str(depth)] if depth else []),
        repo,
        ref,
    ]
    _git(root, *fetch)
    commit = _git(root, "rev-parse", "FETCH_HEAD")
    current = root / link
    previous = os.readlink(current) if current.is_symlink() else None
    worktree = f".worktrees/{commit}"
    if previous == worktree:
        return None
    if not (root / worktree).exists():
        _git(root, "worktree", "add", "--quiet", "--force", "--detach", worktree, commit)
    staged = root / f".{link}.new"
    staged.unlink(missing_ok=True)
    staged.symlink_to(worktree)
    os.replace(staged, current)
    if previous:
        _git(root, "worktree", "remove", "--force", previous)
    return commit


def main() -> None:
    env = os.environ
    root, link = Path(env["GITSYNC_ROOT"]), env.get("GITSYNC_LINK", "hooks")
    period = float(env.get("GITSYNC_PERIOD", "10s").rstrip("s"))
    depth = int(env.get("GITSYNC_DEPTH", "1"))
    print(
        f"git-sync (local stand-in): {env['GITSYNC_REPO']} every {period:g} s into {root}",
        file=sys.stderr,
        flush=True,
    )
    while True:
        try:
            commit = sync_once(
                env["GITSYNC_REPO"], env.get("GITSYNC_REF", "HEAD"), root, link, depth
            )
            if commit:
                print(f"git-sync (local stand-in): published {commit}", file=sys.stderr, flush=True)
        except subprocess.CalledProcessError as err:
            print(f"git-sync (local stand-in): {err.stderr.strip()}", file=sys.stderr, flush=True)
        time.sleep(period)


if __name__ == "__main__":
    main()
