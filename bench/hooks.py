"""Job hooks from git, measured in one run. Prints one JSON document.

- push to active: 20 pushes to the hooks repository, each timed until every worker has
  checked and activated it (local git-sync stand-in, period 1 s; git-sync's default is 10 s);
- the dispatcher alone: one prolog invocation with an empty tree and with 5 scripts;
- per-job overhead: 500 jobs through a cluster without hooks, then with hooks (empty tree),
  then with 5 prolog scripts (bench/local_cluster.py's workload).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from local_cluster import workload

from slonk.local import cluster as local

PUSHES = 20
WORKERS = ("slonk-cpu-0", "slonk-cpu-1")
FIVE_SCRIPTS = {f"prolog.d/{i}0-check": "#!/bin/sh\ntrue\n" for i in range(1, 6)}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def push(repo: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--allow-empty", "--message", "bench")
    return git(repo, "rev-parse", "HEAD")


def active_everywhere(cluster: local.Cluster, commit: str) -> bool:
    return all(
        f"active:  {commit}" in cluster.run(w, ["slonk", "hooks", "status"]).stdout for w in WORKERS
    )


def push_to_active(cluster: local.Cluster, repo: Path) -> list[float]:
    seconds = []
    for i in range(PUSHES):
        started = time.perf_counter()
        commit = push(repo, {"prolog.d/10-bench": f"#!/bin/sh\n# push {i}\ntrue\n"})
        while not active_everywhere(cluster, commit):
            time.sleep(0.02)
        seconds.append(time.perf_counter() - started)
    return seconds


def dispatcher_ms(cluster: local.Cluster, runs: int = 20) -> float:
    timing = (
        "import subprocess,sys,time\n"
        "t=time.perf_counter()\n"
        f"for _ in range({runs}): subprocess.run(['/run/slonk/bin/prolog'], check=True)\n"
        f"print((time.perf_counter()-t)/{runs}*1000)\n"
    )
    out = cluster.run("slonk-cpu-0", [sys.executable, "-c", timing])
    return round(float(out.stdout), 1)


def up(state: Path, values: str) -> local.Cluster:
    values_file = state.with_suffix(".yaml")
    values_file.write_text(values)
    return local.up(state, [values_file], progress=lambda m: None)


def main() -> None:
    result: dict = {"benchmark": "hooks", "git_sync_default_period_seconds": 10}
    with tempfile.TemporaryDirectory(prefix="slonk-bench-hooks-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        git(repo, "init", "--quiet")
        push(repo, {"README": "bench\n"})
        plain, hooked = Path(tmp) / "plain", Path(tmp) / "hooked"
        try:
            result["jobs_without_hooks"] = workload(up(plain, "{}\n").ssh("demo", ["sh", "-s"]))
        finally:
            local.down(plain, purge=True, progress=lambda m: None)
        try:
            cluster = up(
                hooked,
                f"hooks: {{enabled: true, git: {{repo: 'file://{repo}', periodSeconds: 1}}}}\n",
            )
            while not active_everywhere(cluster, git(repo, "rev-parse", "HEAD")):
                time.sleep(0.05)
            result["dispatcher_empty_tree_ms"] = dispatcher_ms(cluster)
            result["jobs_hooks_empty_tree"] = workload(cluster.ssh("demo", ["sh", "-s"]))
            latencies = push_to_active(cluster, repo)
            result["push_to_active_seconds"] = {
                "pushes": PUSHES,
                "period_seconds": 1,
                "p50": round(statistics.median(latencies), 2),
                "p95": round(sorted(latencies)[int(PUSHES * 0.95) - 1], 2),
            }
            commit = push(repo, FIVE_SCRIPTS)
            while not active_everywhere(cluster, commit):
                time.sleep(0.05)
            result["dispatcher_5_scripts_ms"] = dispatcher_ms(cluster)
            result["jobs_hooks_5_scripts"] = workload(cluster.ssh("demo", ["sh", "-s"]))
        finally:
            local.down(hooked, purge=True, progress=lambda m: None)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
