"""LOCAL MODE ONLY: a stand-in for the git-sync sidecar, whose image cannot run here.

It honours git-sync v4's on-disk contract, which is all slonk relies on: under GITSYNC_ROOT,
each fetched commit gets a worktree in `.worktrees/<commit>`, and GITSYNC_LINK is a relative
symlink swapped to the new worktree in one rename, after which the old worktree is removed.
It reads the same GITSYNC_* variables as the real sidecar (REPO, REF, PERIOD, DEPTH, ROOT,
LINK) and uses real git. On Kubernetes the chart runs git-sync itself.

It runs as root on the host (in the pod's network namespace only), so the repository and ref
are untrusted input to a root git: both are checked (`check_repo`, `check_ref`), handed to git
only after `--`, and git may speak only the transports listed in ALLOWED_PROTOCOLS (no `ext::`
remote helper running commands). The host's git configuration is not read.

What it fetches is root's alone, as the chart's volume is (an init container gives git-sync's
root to uid 65533, group root, mode 0750): hooks may carry a site's secrets, and jobs run as
their users in the pod that mounts it. The root directory is made 0700 on every sync and git
runs with umask 077, so no job user can reach `.git`, a worktree or a file in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

# git's own allow-list, also for what a server redirects to: `ext` and `fd` run commands.
ALLOWED_PROTOCOLS = ("file", "git", "http", "https", "ssh")
SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(/.*)?")
SCP_LIKE = re.compile(r"(?:[^@/:\s]+@)?([^@/:\s]+):(.*)")
# A branch, tag or commit: no option, no refspec (`:`, `+`, `*`), no `..`, `@{` or `^`.
REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,254}")
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
CONTROL = re.compile(r"[\x00-\x20\x7f]")
PRIVATE_UMASK = 0o077  # what git writes under the root: its user's alone
GIT_ENV = {
    "GIT_ALLOW_PROTOCOL": ":".join(ALLOWED_PROTOCOLS),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
}


class Refused(ValueError):
    pass


def check_repo(repo: str) -> str:
    """The repository, if git can only read it as a repository of an allowed transport."""
    if not repo or CONTROL.search(repo) or repo.startswith("-") or "::" in repo:
        raise Refused(f"GITSYNC_REPO {repo!r}: not a repository URL git-sync may fetch")
    if scheme := SCHEME.fullmatch(repo):
        name, host = scheme.group(1).lower(), scheme.group(2).rpartition("@")[2]
        if name not in ALLOWED_PROTOCOLS or host.startswith("-"):
            raise Refused(f"GITSYNC_REPO {repo!r}: only {', '.join(ALLOWED_PROTOCOLS)} URLs")
    elif not repo.startswith("/"):
        scp = SCP_LIKE.fullmatch(repo)
        if scp is None or scp.group(1).startswith("-"):
            raise Refused(f"GITSYNC_REPO {repo!r}: not a URL, host:path or absolute path")
    return repo


def check_ref(ref: str) -> str:
    if not REF.fullmatch(ref) or ".." in ref or ref.endswith((".", "/", ".lock")):
        raise Refused(f"GITSYNC_REF {ref!r}: not a branch, tag or commit name")
    return ref


def check_link(link: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}", link):
        raise Refused(f"GITSYNC_LINK {link!r}: not a plain file name")
    return link


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        umask=PRIVATE_UMASK,
    ).stdout.strip()


def sync_once(repo: str, ref: str, root: Path, link: str, depth: int) -> str | None:
    """Fetch `ref`; publish its commit if new. Returns the commit published, or None."""
    check_repo(repo)
    check_ref(ref)
    check_link(link)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)  # closes whatever an older stand-in left open beneath it
    if not (root / ".git").exists():
        _git(root, "init", "--quiet")
    depth_option = [f"--depth={depth}"] if depth > 0 else []
    _git(root, "fetch", "--quiet", "--no-tags", *depth_option, "--", repo, ref)
    commit = _git(root, "rev-parse", "--verify", "--end-of-options", "FETCH_HEAD^{commit}")
    if not COMMIT.fullmatch(commit):
        raise Refused(f"git rev-parse FETCH_HEAD gave {commit!r}, not a commit id")
    current = root / link
    previous = os.readlink(current) if current.is_symlink() else None
    worktree = f".worktrees/{commit}"
    if previous == worktree:
        return None
    if not (root / worktree).exists():
        _git(root, "worktree", "add", "--quiet", "--force", "--detach", "--", worktree, commit)
    staged = root / f".{link}.new"
    staged.unlink(missing_ok=True)
    staged.symlink_to(worktree)
    os.replace(staged, current)
    if previous:
        _git(root, "worktree", "remove", "--force", "--", previous)
        # As git-sync cleans up after a sync, but keeping nothing unreachable: what an old
        # revision held (a large file since removed) leaves the disk with it.
        _git(root, "reflog", "expire", "--expire-unreachable=all", "--all")
        _git(root, "gc", "--quiet", "--prune=now")
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
        except Refused as err:
            print(f"git-sync (local stand-in): refused: {err}", file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(period)


if __name__ == "__main__":
    main()
