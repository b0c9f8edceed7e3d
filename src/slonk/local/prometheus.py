"""Debian's Prometheus for a local cluster (`slonk local up --prometheus`): it scrapes slonk's
exporter on the controller and every worker pod, every SCRAPE_INTERVAL.

The pods' addresses exist only in the cluster's own network namespace (its switch), so
Prometheus runs there, listening on that namespace's loopback (LISTEN: each cluster has its
own); slonk.local.forward carries the host's loopback to it (PREFERRED_HOST_PORT when free,
else a port the kernel picks), for a browser and the tests. Both are processes in the
switch's namespace, so `down` ends them with it (Prometheus first, with SIGTERM, so that it
closes its storage). Its targets are a file_sd file written from the cluster's record, again
whenever `upgrade` changes the pod set. Configuration, targets and log live in
<state>/prometheus/ (made again by `up`), its data in <state>/prometheus-data/, kept across
`down` as volumes are (--purge removes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import yaml

from slonk.base.files import write_atomically
from slonk.config.spec import ClusterSpec
from slonk.local.manifests import LocalModeError
from slonk.local.network import NETNS_DIR, netns_inode
from slonk.local.state import Cluster

BINARY = "prometheus"
LISTEN = "127.0.0.1:9090"
PREFERRED_HOST_PORT = 9090
# Short, for a local cluster: a drain shows within seconds (a real cluster scrapes every 30 s).
SCRAPE_INTERVAL = "2s"
RETENTION = "7d"
JOB = "slonk"
# The pods that run slonk's exporter (metrics.enabled), by role.
SCRAPED_ROLES = ("controller", "worker")
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 10.0
HOST_FILE = "host-address"
PID_FILE = "pid"
TARGETS_FILE = "targets.json"


def enabled(cluster: Cluster) -> bool:
    """Whether this cluster runs Prometheus (`up --prometheus`, kept in its record)."""
    return bool(cluster.record_file.exists() and cluster.record().get("prometheus"))


def targets(cluster: Cluster, spec: ClusterSpec) -> list[dict[str, Any]]:
    """file_sd's target groups: each exporter pod at its address, labelled with its name and
    role (as Kubernetes service discovery labels a pod); none when metrics are off."""
    if spec.metrics is None:
        return []
    return [
        {
            "targets": [f"{pod['address']}:{spec.metrics.port}"],
            "labels": {"pod": name, "role": pod["role"]},
        }
        for name, pod in sorted(cluster.record()["pods"].items())
        if pod["role"] in SCRAPED_ROLES
    ]


def write_targets(cluster: Cluster, spec: ClusterSpec) -> None:
    """Prometheus rereads the file when it changes (file_sd): no restart."""
    write_atomically(
        cluster.prometheus_dir / TARGETS_FILE, json.dumps(targets(cluster, spec), indent=1)
    )


def config(cluster: Cluster) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
        },
        "scrape_configs": [
            {
                "job_name": JOB,
                "metrics_path": "/metrics",
                "file_sd_configs": [
                    {
                        "files": [str(cluster.prometheus_dir / TARGETS_FILE)],
                        "refresh_interval": "5s",
                    }
                ],
            }
        ],
    }


def url(cluster: Cluster) -> str | None:
    """Where the host reaches this cluster's Prometheus, while it runs."""
    try:
        return f"http://{(cluster.prometheus_dir / HOST_FILE).read_text().strip()}"
    except FileNotFoundError:
        return None


def check(spec: ClusterSpec) -> str:
    """The Prometheus binary, once sure it can scrape this cluster: `up` asks before it makes
    anything."""
    binary = shutil.which(BINARY)
    if binary is None:
        raise LocalModeError(
            "--prometheus runs Debian's Prometheus: apt-get install prometheus (scripts/setup "
            "installs it)"
        )
    if spec.metrics is None:
        raise LocalModeError(
            "--prometheus scrapes slonk's exporter, but metrics.enabled is false in the values"
        )
    return binary


def start(cluster: Cluster, spec: ClusterSpec) -> str:
    """Start Prometheus and its relay in the cluster's switch namespace; returns its URL
    once it answers ready."""
    binary = check(spec)
    folder = cluster.prometheus_dir
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    cluster.prometheus_data.mkdir(parents=True, exist_ok=True, mode=0o700)
    (folder / HOST_FILE).unlink(missing_ok=True)
    write_targets(cluster, spec)
    write_atomically(folder / "prometheus.yml", yaml.safe_dump(config(cluster), sort_keys=False))
    netns = NETNS_DIR / cluster.network.switch
    with open(folder / "log", "ab") as log:
        server = subprocess.Popen(
            ["nsenter", f"--net={netns}", "--", binary,
             f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={cluster.prometheus_data}",
             f"--storage.tsdb.retention.time={RETENTION}",
             f"--web.listen-address={LISTEN}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        (folder / PID_FILE).write_text(f"{server.pid}\n")
        relay = subprocess.Popen(
            [sys.executable, "-m", "slonk.local.forward", str(netns), LISTEN,
             str(folder / HOST_FILE), str(PREFERRED_HOST_PORT)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not _ready(cluster):
        for process, what in ((server, "Prometheus"), (relay, "its relay")):
            if process.poll() is not None:
                raise LocalModeError(f"{what} stopped: see {folder / 'log'}")
        if time.monotonic() > deadline:
            raise LocalModeError(f"Prometheus not ready after {READY_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.1)
    return str(url(cluster))


def _ready(cluster: Cluster) -> bool:
    where = url(cluster)
    if where is None:
        return False
    try:
        with urllib.request.urlopen(f"{where}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(cluster: Cluster) -> None:
    """SIGTERM Prometheus and wait for it to close its storage (`down` kills what is left in
    the namespace after). Only the pid it wrote, and only while that process is still in
    this cluster's switch namespace (a pid is reused once its process is gone)."""
    try:
        pid = int((cluster.prometheus_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return
    switch = netns_inode(cluster.network.switch)

    def running() -> bool:
        try:
            return switch is not None and os.stat(f"/proc/{pid}/ns/net").st_ino == switch
        except OSError:
            return False

    if not running():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
