"""Memory of every pod's processes (PSS and RSS from /proc/PID/smaps_rollup) on a small local
cluster, for a baseline revision and this checkout, in one run. Prints one JSON document.

    .venv/bin/python bench/pod_memory.py [--baseline REV] [--workers N]   (as root)

Local mode's defaults (LDAP's development directory, metrics on) plus hooks from a local git
repository, so that every loop a pod may run runs. The baseline is checked out with `git
worktree add` into a temporary directory (removed at the end); each tree's `slonk local up`
runs from its src/ (local pods then run that tree's code and rootfs/). A pod is measured once
its loops have done their first work: each worker's hooks active, each metrics endpoint
answering. A pod's processes are its root process and all its descendants; PSS shares each
page among the processes mapping it (the interpreter's code among a pod's Python processes),
RSS counts it in each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SETTLE_TIMEOUT_SECONDS = 300.0


def _slonk(src: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, "-m", "slonk.cli", *args],
        capture_output=True, text=True, cwd="/", env=env, check=check, timeout=900,
    )  # fmt: skip


def _wait(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"pod_memory: gave up waiting for {what}")
        time.sleep(0.5)


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found.setdefault(int(fields[1]), []).append(int(entry))
    return found


def _memory(pid: int) -> dict[str, Any] | None:
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    kb = {line.split(":")[0]: int(line.split()[1]) for line in rollup.splitlines()[1:]}
    words = [os.path.basename(a.decode(errors="replace")) for a in argv if a][:4]
    return {"cmd": " ".join(words), "pss_kb": kb["Pss"], "rss_kb": kb["Rss"]}


def measure_pod(root_pid: int) -> dict[str, Any]:
    children, todo, pids = _children(), [root_pid], []
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    processes = [m for m in map(_memory, sorted(pids)) if m]
    return {
        "pss_mib": round(sum(p["pss_kb"] for p in processes) / 1024, 1),
        "rss_mib": round(sum(p["rss_kb"] for p in processes) / 1024, 1),
        "processes": len(processes),
        "python_processes": sum("python" in p["cmd"] or "slonk" in p["cmd"] for p in processes),
        "each": processes,
    }


def _hooks_repo(path: Path) -> None:
    path.mkdir(parents=True)
    prolog = path / "prolog"
    prolog.mkdir()
    (prolog / "00-true").write_text("#!/bin/sh\ntrue\n")
    (prolog / "00-true").chmod(0o755)
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=b", "-c", "user.email=b@x",
                                                 "commit", "-qm", "hooks"]):  # fmt: skip
        subprocess.run(["git", "-C", str(path), *args], check=True, env={**os.environ, **env})


def _hooks_active(src: Path, state: Path, pod: str) -> bool:
    said = _slonk(
        src, "local", "exec", pod, "--state-dir", str(state), "--", "slonk", "hooks", "status",
        check=False,
    ).stdout  # fmt: skip
    return said.startswith("active:  ") and not said.startswith("active:  none")


def run_tree(src: Path, workers: int, scratch: Path) -> dict[str, Any]:
    from slonk.local.cluster import Cluster

    repo = scratch / "hooks"
    _hooks_repo(repo)
    state = scratch / "state"
    values = scratch / "values.yaml"
    values.write_text(yaml.safe_dump({
        "nodepools": {"cpu": {"replicas": workers, "cpus": 4, "memoryMiB": 1024}},
        "hooks": {"enabled": True, "git": {"repo": f"file://{repo}", "periodSeconds": 10}},
    }))  # fmt: skip
    try:
        _slonk(src, "local", "up", "-f", str(values), "--state-dir", str(state))
        cluster = Cluster(state.resolve())
        names = cluster.pod_names()
        for pod in (n for n in names if n.startswith("slonk-cpu-")):
            _wait(f"{pod}'s hooks", lambda pod=pod: _hooks_active(src, state, pod))
        scrape = "import urllib.request as u; u.urlopen('http://127.0.0.1:9341/metrics').read()"
        for pod in (n for n in names if n.startswith(("slonk-cpu-", "slonk-controller-"))):
            _wait(
                f"{pod}'s metrics",
                lambda pod=pod: _slonk(
                    src, "local", "exec", pod, "--state-dir", str(state), "--",
                    "python3", "-c", scrape, check=False,
                ).returncode == 0,
            )  # fmt: skip
        pods = {}
        for name in names:
            pid = cluster.pid(name)
            if pid is not None:
                pods[name] = measure_pod(pid)
        return pods
    finally:
        _slonk(src, "local", "down", "--purge", "--state-dir", str(state), check=False)


def summary(pods: dict[str, Any]) -> dict[str, Any]:
    roles: dict[str, list[dict[str, Any]]] = {}
    for name, pod in pods.items():
        role = "worker" if name.startswith("slonk-cpu-") else name.removeprefix("slonk-")
        roles.setdefault(role.rsplit("-", 1)[0], []).append(pod)
    return {
        role: {
            key: round(sum(p[key] for p in found) / len(found), 1)
            for key in ("pss_mib", "rss_mib", "processes", "python_processes")
        }
        for role, found in roles.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", default="main", help="git revision to compare with")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slonk-pod-memory-") as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.baseline],
            check=True,
        )
        try:
            trees = {"baseline": base / "src", "this": ROOT / "src"}
            results = {}
            for label, src in trees.items():
                scratch = Path(tmp) / f"{label}-run"
                scratch.mkdir()
                results[label] = run_tree(src, args.workers, scratch)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False
            )
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(json.dumps({
        "baseline": args.baseline,
        "this": revision,
        "workers": args.workers,
        "per_role_mean": {label: summary(pods) for label, pods in results.items()},
        "pods": results,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
