"""`slonk local` at scale, in one run: N worker pods (256 by default; `--quick`: 8) up to every
node idle, a job on all of them, memory per pod and in all, three herds, then `down`. Prints
one JSON document.

- up_to_idle_seconds: `slonk local up` until every node is idle (its own figure), with when
  the pods were all launched.
- srun_all_seconds: `srun -N<N> hostname` from the controller pod, every node answering.
- memory: PSS and RSS (/proc/<pid>/smaps_rollup) of every process in each pod's network
  namespace (its processes and its sidecars' stand-ins), per worker pod (median, max) and
  summed over all pods. PSS splits shared pages among their users: the sum is what the pods
  take together; RSS counts shared pages in every process.
- herds, each the seconds from the cause to each worker having it (p50, max), read from the
  host through each pod's root (/proc/<PID 1>/root), every 50 ms, without entering the pods:
    config: a health setting changed by `slonk local upgrade` (as a values change reaches
            pods locally: the ConfigMap's projection) until the worker's health plan
            (slonk.base.paths.HEALTH_PLAN) changes; from the start of the upgrade.
    ldap:   a user added to the directory (ldapadd in the slapd pod) until every pod's
            /etc/passwd, what `getent passwd` reads, has it (the controller's too).
    git:    a commit to the hooks repository until the worker's active hook revision
            (slonk.base.paths.HOOKS_STATE/active) is that commit.
- down_seconds: `slonk local down`.

It reads files and the pods' state only through slonk.base.paths and slonk.local, so it measures
whatever services the pods run. Run as root, alone on the machine if the figures matter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from slonk.base import paths
from slonk.local import cluster as local
from slonk.local import upgrade
from slonk.local.network import processes_by_netns

LDAP_SUFFIX = "dc=slonk,dc=local"
HERD_TIMEOUT_SECONDS = 600.0
SRUN_TIMEOUT_SECONDS = 600
POLL_SECONDS = 0.05
CONTROLLER = "slonk-controller-0"
# What a worker pod takes with the chart's services (PSS, measured: 75 MiB at 8 workers, less
# as more share its pages): the bench refuses to start a cluster free memory cannot hold.
WORKER_MIB_ESTIMATE = 70
SPARE_MIB = 1024


def values(workers: int, repo: Path) -> dict[str, Any]:
    """Small worker pods with the chart's services (health checks, exporter, hooks, users
    from the development directory); no login pod and no accounting, which the herds and
    jobs here do not need."""
    return {
        "nodepools": {"cpu": {"replicas": workers, "cpus": 1, "memoryMiB": 256}},
        "login": {"replicas": 0},
        "accounting": {"enabled": False},
        "hooks": {"enabled": True, "git": {"repo": f"file://{repo}"}},
    }


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=b@b", *args],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def commit(repo: Path, message: str) -> str:
    git(repo, "commit", "--quiet", "--allow-empty", "--message", message)
    return git(repo, "rev-parse", "HEAD")


def in_pod(cluster: local.Cluster, name: str, path: Path) -> Path:
    """A file of a running pod, seen from the host through its PID 1's root."""
    return Path(f"/proc/{cluster.pid(name)}/root") / path.relative_to("/")


def read(path: Path) -> str | None:
    try:
        return os.readlink(path) if path.is_symlink() else path.read_text()
    except OSError:
        return None


def herd(pods: Iterable[str], reached: Callable[[str], bool], since: float) -> dict[str, Any]:
    """Seconds from `since` until `reached(pod)` for every pod, polled together."""
    waiting, seconds = set(pods), []
    deadline = time.monotonic() + HERD_TIMEOUT_SECONDS
    while waiting and time.monotonic() < deadline:
        now = time.monotonic()
        for pod in [p for p in waiting if reached(p)]:
            waiting.discard(pod)
            seconds.append(now - since)
        time.sleep(POLL_SECONDS)
    return {
        "pods": len(seconds) + len(waiting),
        "p50_seconds": round(statistics.median(seconds), 2) if seconds else None,
        "max_seconds": round(max(seconds), 2) if seconds else None,
        "not_reached": len(waiting),
    }


def memory(cluster: local.Cluster) -> dict[str, Any]:
    """PSS and RSS (MiB) of each pod's processes: per worker (median, max), and in all."""
    names = cluster.pod_names()
    netns = {cluster.network.pod_netns(n): n for n in names}
    per_pod = {n: {"pss": 0, "rss": 0, "processes": 0} for n in names}
    first_worker = cluster.pod_names("worker")[0]
    by_process: dict[str, float] = {}
    for ns, pids in processes_by_netns(netns).items():
        pod = per_pod[netns[ns]]
        for pid in pids:
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue  # gone meanwhile, or a kernel thread
            fields = {line.split(":")[0]: line.split()[1] for line in rollup[1:] if ":" in line}
            pod["pss"] += int(fields.get("Pss", 0))
            pod["rss"] += int(fields.get("Rss", 0))
            pod["processes"] += 1
            if netns[ns] == first_worker:
                label = " ".join(argv.split("\0")[:4]).strip()[:60]
                by_process[label] = by_process.get(label, 0) + int(fields.get("Pss", 0))
    workers = [per_pod[n] for n in cluster.pod_names("worker")]

    def mib(kib: float) -> float:
        return round(kib / 1024, 1)

    return {
        "worker_pss_mib_median": mib(statistics.median(p["pss"] for p in workers)),
        "worker_pss_mib_max": mib(max(p["pss"] for p in workers)),
        "worker_rss_mib_median": mib(statistics.median(p["rss"] for p in workers)),
        "worker_rss_mib_max": mib(max(p["rss"] for p in workers)),
        "worker_processes_median": statistics.median(p["processes"] for p in workers),
        "all_pods_pss_mib": mib(sum(p["pss"] for p in per_pod.values())),
        "all_pods_rss_mib": mib(sum(p["rss"] for p in per_pod.values())),
        "pods": len(names),
        f"{first_worker}_pss_mib_by_process": {
            k: mib(v) for k, v in sorted(by_process.items(), key=lambda i: -i[1])
        },
    }


def config_herd(cluster: local.Cluster, work: Path, percent: int) -> dict[str, Any]:
    workers = cluster.pod_names("worker")
    plan = paths.HEALTH_PLAN
    before = {w: read(in_pod(cluster, w, plan)) for w in workers}
    change = work / f"health-{percent}.yaml"
    change.write_text(yaml.safe_dump(
        {"health": {"checks": {"scratch": {"minFreePercent": percent}}}}
    ))  # fmt: skip
    since = time.monotonic()
    upgrade.upgrade(cluster.state_dir, [change], progress=lambda _: None)
    upgraded = time.monotonic() - since
    result = herd(workers, lambda w: read(in_pod(cluster, w, plan)) != before[w], since)
    return {**result, "upgrade_returned_seconds": round(upgraded, 2)}


def ldap_herd(cluster: local.Cluster, name: str, uid: int) -> dict[str, Any]:
    key = cluster.client_key.with_suffix(".pub").read_text().strip()
    ldif = "\n".join([
        f"dn: uid={name},ou=people,{LDAP_SUFFIX}", "objectClass: inetOrgPerson",
        "objectClass: posixAccount", "objectClass: ldapPublicKey", f"uid: {name}",
        f"cn: {name}", f"sn: {name}", f"uidNumber: {uid}", "gidNumber: 5100",
        f"homeDirectory: /home/{name}", "loginShell: /bin/bash", f"sshPublicKey: {key}", "",
    ])  # fmt: skip
    add = (
        f"ldapadd -x -H ldap://localhost -D cn=admin,{LDAP_SUFFIX} "
        f"-w \"$(cat /var/run/secrets/slonk/ldap-admin/password)\" <<'LDIF'\n{ldif}\nLDIF"
    )
    since = time.monotonic()
    subprocess.run(cluster.enter("slonk-ldap-0", ["/bin/sh", "-c", add]), check=True,
                   capture_output=True, cwd="/")  # fmt: skip
    pods = [*cluster.pod_names("worker"), *cluster.pod_names("controller")]
    line = f"{name}:x:{uid}:"

    def has(pod: str) -> bool:
        passwd = read(in_pod(cluster, pod, Path("/etc/passwd"))) or ""
        return any(entry.startswith(line) for entry in passwd.splitlines())

    return herd(pods, has, since)


def git_herd(cluster: local.Cluster, repo: Path, message: str) -> dict[str, Any]:
    active = paths.HOOKS_STATE / "active"
    since = time.monotonic()
    revision = commit(repo, message)
    return herd(
        cluster.pod_names("worker"),
        lambda w: (read(in_pod(cluster, w, active)) or "").endswith(revision),
        since,
    )


def run(workers: int, work: Path) -> dict[str, Any]:
    repo = work / "hooks"
    repo.mkdir()
    git(repo, "init", "--quiet")
    commit(repo, "first")
    values_file = work / "values.yaml"
    values_file.write_text(yaml.safe_dump(values(workers, repo)))
    state_dir = work / "state"
    events: list[tuple[float, str]] = []
    result: dict[str, Any] = {"workers": workers}
    started = time.monotonic()

    def note(message: str) -> None:
        """`up`'s progress, kept for the result and shown on stderr as it comes."""
        events.append((time.monotonic() - started, message))
        print(f"{events[-1][0]:7.1f} s  {message}", file=sys.stderr, flush=True)

    try:
        cluster = local.up(state_dir, [values_file], progress=lambda m: note(m.strip()))
        result["up_to_idle_seconds"] = round(time.monotonic() - started, 2)
        result["pods_launched_seconds"] = next(
            round(t, 2) for t, m in events if m.startswith("started ")
        )
        result["progress_lines"] = [m for _, m in events if m.startswith("nodes:")]
        t = time.monotonic()
        srun = ["srun", f"--nodes={workers}", "--ntasks-per-node=1", "hostname"]
        try:
            out = subprocess.run(
                cluster.enter(CONTROLLER, srun),
                capture_output=True,
                text=True,
                check=False,
                cwd="/",
                timeout=SRUN_TIMEOUT_SECONDS,
            )
            result["srun_nodes_answered"] = len(set(out.stdout.split()))
            if out.returncode:
                result["srun_error"] = out.stderr.strip()[-500:]
        except subprocess.TimeoutExpired:  # the rest is still worth measuring
            result["srun_error"] = f"no answer in {SRUN_TIMEOUT_SECONDS} s"
        result["srun_all_seconds"] = round(time.monotonic() - t, 2)
        result["memory"] = memory(cluster)
        note("measuring the herds")
        result["herds"] = {
            "config": config_herd(cluster, work, 7),
            "ldap": ldap_herd(cluster, "herd", 5301),
            "git": git_herd(cluster, repo, "herd"),
        }
    finally:
        t = time.monotonic()
        local.down(state_dir, purge=True, progress=note)
        result["down_seconds"] = round(time.monotonic() - t, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="8 workers, for development")
    parser.add_argument("--force", action="store_true", help="start even if memory looks short")
    args = parser.parse_args()
    workers = 8 if args.quick else args.workers
    local.require_root()
    available = int(next(
        line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemAvailable:")
    )) // 1024  # fmt: skip
    if available < workers * WORKER_MIB_ESTIMATE + SPARE_MIB and not args.force:
        sys.exit(f"local_scale: {workers} workers need about {workers * WORKER_MIB_ESTIMATE} "
                 f"MiB, {available} MiB available (--force to try)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="slonk-scale-") as tmp:
        result = run(workers, Path(tmp))
    print(json.dumps({
        "benchmark": "local_scale",
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
                                        / 2**30, 1)},
        "command": shlex.join(sys.argv),
        **result,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
