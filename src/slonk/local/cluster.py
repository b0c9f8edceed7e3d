"""`slonk local`: a local cluster's lifecycle. `up` renders the chart and runs every
StatefulSet replica as a pod, `down` undoes it, `restart` and `status` act on its pods.

The parts, each in its own module, each importing only modules below it in this list:
  release         the chart's values, objects and spec for local mode, and their files
  podspec         a rendered pod as the spec a runtime starts (pod.json)
  fake_apiserver  a FAKE Kubernetes API (parts in slonk.local.apiserver) for the pods and
                  kubectl; it stops and starts pods through kubelet
  kubelet         start, stop and restart one pod; sidecars, its stand-in processes
  nodes           the cluster's Slurm nodes as its controller sees them
  firewall        the chart's NetworkPolicies as iptables rules in each pod's namespace
  host            the host's kernel limits a cluster of many pods needs (sysctls)
  associations    the spec's users as slurmctld's associations (accounting)
  prometheus      with `up --prometheus`: Debian's Prometheus scraping the pods' exporters,
                  reached from the host through `forward`
  state           the state directory's layout, and `Cluster`, the handle every part reads it by
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slonk.kube import chart
from slonk.local import fake_apiserver, firewall, host, podman, prometheus
from slonk.local.associations import wait_associations
from slonk.local.kubelet import kill_all, restart_pod, start_pods, stop_pods
from slonk.local.manifests import LocalModeError, hosts_file
from slonk.local.network import NETNS_DIR, is_mount_point, pod_addresses, processes_by_netns
from slonk.local.nodes import mark_down, node_states, wait_nodes_up
from slonk.local.podspec import pod_spec
from slonk.local.release import NAMESPACE, known_hosts, project_objects, render
from slonk.local.state import (
    DEFAULT_STATE_DIR,
    Cluster,
    check_state_dir,
    save_values,
    write_record,
)

# This module's API, and the names from its parts that callers outside slonk.local (the
# CLI, bench/, tests) take from here.
__all__ = [
    "DEFAULT_STATE_DIR",
    "Cluster",
    "down",
    "node_states",
    "pod_spec",
    "require_root",
    "restart",
    "status",
    "stop_order",
    "up",
    "wait_nodes_up",
]


def require_root() -> None:
    if os.geteuid() != 0:
        raise LocalModeError("slonk local needs root: it makes network namespaces and mounts")


def up(
    state_dir: Path,
    value_files: Sequence[Path] = (),
    progress: Callable[[str], None] = print,
    runtime: str = "host",
    with_prometheus: bool = False,
) -> Cluster:
    """Start the chart's pods; `runtime` host runs them on the host's files with rootfs/
    layered over, podman from the images the chart names (slonk.local.podman).
    `with_prometheus`: and Debian's Prometheus scraping them (slonk.local.prometheus)."""
    require_root()
    cluster = Cluster(check_state_dir(state_dir).resolve())
    if cluster.record_file.exists() and any(cluster.pid(n) for n in cluster.pod_names()):
        raise LocalModeError(f"a cluster is already up in {state_dir}: `slonk local down` first")
    # It holds the controller's API token and the cluster's keys: root's alone, as made.
    cluster.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_state_dir(cluster.state_dir)
    cluster.state_dir.chmod(0o700)
    started = time.monotonic()
    user = chart.user_values(value_files)
    objects, spec = render(cluster, user)
    if with_prometheus:
        prometheus.check(spec)
    save_values(cluster, user)
    progress(f"slonk local: {len(objects.pods)} pods from the chart, state in {cluster.state_dir}")

    project_objects(cluster, objects)
    network = cluster.network
    addresses = pod_addresses([p.name for p in objects.pods], {})
    # Written before anything is made, so that `down` can undo even a partial `up`.
    previous = cluster.record() if cluster.record_file.exists() else {}
    write_record(
        cluster,
        {
            "prefix": network.prefix,
            "made_netns_mount": previous.get("made_netns_mount") or not is_mount_point(NETNS_DIR),
            "runtime": runtime,
            "prometheus": with_prometheus,
            "pods": {p.name: {"role": p.role, "address": addresses[p.name]} for p in objects.pods},
        },
    )
    host.raise_limits(len(objects.pods), progress)
    network.create_switch()
    network.add_pods(addresses)
    firewall.enforce(network, objects, addresses)  # before any pod runs
    known_hosts(cluster, objects, addresses)
    fake_apiserver.start(cluster, objects, NAMESPACE)
    hosts = hosts_file(objects, addresses, spec.cluster_domain)
    start_pods(cluster, [(p, pod_spec(cluster, p, hosts, runtime)) for p in objects.pods], progress)
    if with_prometheus:
        progress(f"slonk local: Prometheus on {prometheus.start(cluster, spec)}")
    wait_nodes_up(cluster, progress=progress)
    wait_associations(cluster, spec, progress=progress)
    progress(f"slonk local: cluster up in {time.monotonic() - started:.2f} s")
    return cluster


def restart(state_dir: Path, name: str, stop_only: bool = False) -> None:
    """Stop a pod (as kubelet would: SIGTERM, then SIGKILL) and start it again."""
    require_root()
    cluster = Cluster(state_dir.resolve())
    if name not in cluster.pod_names():
        raise LocalModeError(f"no pod {name!r}: pods are {', '.join(cluster.pod_names())}")
    restart_pod(cluster, name, stop_only)


# Roles (the pods' component labels) stopped after all others, in this order.
LAST_TO_STOP = ("controller", "slurmdbd", "mariadb")


def stop_order(roles: Mapping[str, str]) -> list[list[str]]:
    """Pods by role ({name: role}) in the waves `down` stops them: every other pod before the
    controller, which saves its state as it stops; then slurmdbd, which takes slurmctld's
    last records, then its database."""
    others = [name for name, role in roles.items() if role not in LAST_TO_STOP]
    last = [[name for name, role in roles.items() if role == r] for r in LAST_TO_STOP]
    return [wave for wave in (others, *last) if wave]


def down(state_dir: Path, purge: bool = False, progress: Callable[[str], None] = print) -> None:
    """Stop every pod and remove every namespace, even after a partial `up`. Idempotent."""
    require_root()
    cluster = Cluster(state_dir.resolve())
    network = cluster.network
    record = cluster.record() if cluster.record_file.exists() else {"pods": {}}
    prometheus.stop(cluster)
    # The fake API server first: its StatefulSets would start again pods the controller's
    # recycle loop deletes meanwhile (seen at 256 workers), and nothing here needs it.
    kill_all([network.switch])
    roles = {name: pod["role"] for name, pod in record["pods"].items()}
    workers = [name for name, role in roles.items() if role == "worker"]
    if workers:
        # A power-off, all workers at once. Their SIGTERM path (stop slurmd, wait for its
        # steps, then a Python `slonk worker down` asking Slurm about its node) took a
        # minute at 256 workers on two cores. Then their nodes are marked DOWN in one call
        # while the controller still runs: Slurm requeues their jobs, and saves no stopped
        # node as up (no ghost job after the next `up`).
        started = time.monotonic()
        kill_all([network.pod_netns(name) for name in workers])
        progress(f"  powered off {len(workers)} workers in {time.monotonic() - started:.1f} s")
        mark_down(cluster, workers, progress)
    others = {name: role for name, role in roles.items() if role != "worker"}
    for wave in stop_order(others):
        stop_pods(cluster, wave, progress, hooks=False)  # no preStop hook: a power-off
    if record.get("runtime") == "podman":
        for name in record["pods"]:
            podman.remove(network.pod_netns(name))
    kill_all(network.namespaces())  # the fake API server, a pod that never finished starting
    network.destroy(made_netns_mount=record.get("made_netns_mount", False))
    if purge:
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
    else:
        for path in cluster.removed_by_down:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    progress(f"slonk local: down ({'state removed' if purge else 'volumes and secrets kept'})")


def status(state_dir: Path) -> str:
    cluster = Cluster(state_dir.resolve())
    rows = [f"{'POD':24} {'ROLE':10} {'ADDRESS':12} {'STATE':8} PROCESSES"]
    record = cluster.record()["pods"]
    running = processes_by_netns(cluster.network.pod_netns(name) for name in record)
    for name, info in record.items():
        pid = cluster.pid(name)
        procs = []
        if pid is not None:
            for p in sorted(running.get(cluster.network.pod_netns(name), [])):
                try:
                    procs.append(Path(f"/proc/{p}/comm").read_text().strip())
                except OSError:
                    continue
        state = "Running" if pid else "Stopped"
        rows.append(f"{name:24} {info['role']:10} {info['address']:12} {state:8} {' '.join(procs)}")
    states = node_states(cluster)
    rows.append("")
    rows.append(
        "Slurm nodes: " + (", ".join(f"{n} {s.label}" for n, s in states.items()) or "unknown")
    )
    if prometheus.enabled(cluster):
        rows.append(f"Prometheus: {prometheus.url(cluster) or 'not running'}")
    return "\n".join(rows)
