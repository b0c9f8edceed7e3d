"""Start-up of the pods' commands: modules loaded and wall time, for a baseline revision and
this checkout, in one run. Prints one JSON document.

    .venv/bin/python bench/startup.py [--baseline REV] [--runs N]

The baseline is checked out with `git worktree add` into a temporary directory (removed at
the end); each tree runs as `python -m slonk.cli` with PYTHONPATH at its src/. Every command
runs as far as it goes without a pod around it: a missing cluster.yaml stops users sync and
init after they imported what they run; health run finds no health plan. (The loops that ran
as commands before are tasks of `slonk agent`, one process a pod.) Runs of the two
trees alternate, so both see the same machine; the time is the median of `--runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["init", "--role", "worker"],
    ["users", "sync", "--cluster", "missing.yaml"],
    ["hooks", "status"],
    ["health", "run"],
    ["agent", "--help"],
]
WATCHED = ("slonk.local", "http.server", "ssl", "yaml", "jinja2", "ldap3")


def _run(src: Path, args: list[str], cwd: Path, importtime: bool = False) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    flags = ["-X", "importtime"] if importtime else []
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *flags, "-m", "slonk.cli", *args],
        capture_output=True, text=True, cwd=cwd, env=env, check=False,
    )  # fmt: skip
    return time.perf_counter() - started, done.stderr


def modules(src: Path, args: list[str], cwd: Path) -> dict[str, object]:
    _, stderr = _run(src, args, cwd, importtime=True)
    names = [
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and not line.endswith("imported package")
    ]
    loaded = {
        watched: sum(1 for n in names if n == watched or n.startswith(f"{watched}."))
        for watched in WATCHED
    }
    return {"modules": len(names), **{k: v for k, v in loaded.items() if v}}


def which_slonk(src: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, "-c", "import slonk; print(slonk.__file__)"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.strip()  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="git revision to compare with")
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command and tree")
    options = parser.parse_args()
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", options.baseline],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="slonk-bench-startup-") as tmp:
        work = Path(tmp)
        baseline = work / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline), revision],
            capture_output=True, check=True,
        )  # fmt: skip
        try:
            trees = {"baseline": baseline / "src", "ours": ROOT / "src"}
            for name, src in trees.items():  # PYTHONPATH must win over the installed slonk
                assert which_slonk(src).startswith(str(src)), (name, which_slonk(src))
            result: dict[str, object] = {}
            for args in COMMANDS:
                seconds: dict[str, list[float]] = {name: [] for name in trees}
                for _ in range(options.runs):
                    for name, src in trees.items():
                        seconds[name].append(_run(src, args, work)[0])
                result[" ".join(args)] = {
                    name: {
                        **modules(src, args, work),
                        "ms": round(statistics.median(seconds[name]) * 1000, 1),
                    }
                    for name, src in trees.items()
                }
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)],
                capture_output=True, check=False,
            )  # fmt: skip
    print(json.dumps({
        "python": platform.python_version(),
        "baseline": revision,
        "runs": options.runs,
        "commands": result,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
