"""What kubelet does for one local pod: start it from its template with fresh writable layers
and its sidecars, stop it (its preStop hook, SIGTERM, SIGKILL once its grace is spent),
restart it, rewrite its hosts."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from slonk.local import pod as pods
from slonk.local import podman
from slonk.local.manifests import LocalModeError, Pod
from slonk.local.network import processes_by_netns, set_sysctls
from slonk.local.sidecars import start_sidecars
from slonk.local.state import Cluster, read_pod_spec, write_pod_spec

# A pod's terminationGracePeriodSeconds when its pod.json predates them: Kubernetes' default.
DEFAULT_GRACE_SECONDS = 30
# Kubernetes' one-off extension when a preStop hook spent the whole grace: SIGTERM still gets
# this long before SIGKILL.
TERM_EXTENSION_SECONDS = 2.0
# Pods launched at once: enough to overlap the forks and mounts of a launch, few enough not
# to starve the pods already starting on a small machine.
PARALLEL_STARTS = 8
INIT_WAIT_SECONDS = 60.0


def _launch(cluster: Cluster, name: str, spec: dict[str, Any]) -> int:
    """Start a pod with fresh writable layers, as a new container would have."""
    pod_dir = cluster.pod_dir(name)
    shutil.rmtree(pod_dir / "layers", ignore_errors=True)
    shutil.rmtree(pod_dir / "scratch", ignore_errors=True)
    for key in ("upper", "work", "target"):
        Path(spec["root"][key]).mkdir(parents=True)
    for volume in spec["binds"]:
        Path(volume["source"]).mkdir(parents=True, exist_ok=True)
    netns = cluster.network.pod_netns(name)
    set_sysctls(netns, spec.get("sysctls", {}))
    write_pod_spec(cluster, name, spec)
    cluster.mark_container_start(name)
    if cluster.record().get("runtime") == "podman":
        pid = podman.start(pod_dir, netns, spec)
    else:
        pid = pods.start(pod_dir, netns)
    (pod_dir / "pid").write_text(f"{pid}\n")
    start_sidecars(cluster, name, spec["sidecars"])
    return pid


def start_pods(
    cluster: Cluster,
    to_start: Sequence[tuple[Pod, dict[str, Any]]],
    progress: Callable[[str], None],
) -> None:
    """Start these pods (each with its spec) together, as kubelets on many machines would,
    PARALLEL_STARTS at a time, each until its init is done. One progress line for all of
    them, counted by role."""
    if not to_start:
        return
    started = time.monotonic()

    def start(pod: Pod, spec: dict[str, Any]) -> None:
        cluster.pod_dir(pod.name).mkdir(parents=True, exist_ok=True)
        pid = _launch(cluster, pod.name, spec)
        # The next pod starts once this one's init is done (its s6-svscan takes signals):
        # hundreds of inits at once on two cores each took over 10 s, and timed out launches.
        # A pod that does not get there in time is left to `up`'s wait, which reports it.
        pods.wait_handles(pid, signal.SIGTERM, INIT_WAIT_SECONDS)

    with ThreadPoolExecutor(max_workers=PARALLEL_STARTS) as pool:
        list(pool.map(lambda item: start(*item), to_start))
    roles = Counter(pod.role for pod, _ in to_start)
    counted = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    progress(f"  started {len(to_start)} pods ({counted}) in {time.monotonic() - started:.1f} s")


def kill_all(netns: Sequence[str]) -> None:
    """SIGKILL to every process left in these network namespaces (one pass over /proc)."""
    for pids in processes_by_netns(netns).values():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _pre_stop(cluster: Cluster, name: str, command: Sequence[str], seconds: float) -> None:
    """Run the pod's preStop hook in it, as kubelet does, within `seconds`; its output goes to
    the pod's log. A hook that fails or overruns is logged, and the pod stops all the same."""
    with open(cluster.log_file(name), "ab") as log:
        try:
            done = subprocess.run(
                cluster.enter(name, command), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, timeout=seconds, check=False, cwd="/",
            )  # fmt: skip
            failed = f"exited {done.returncode}" if done.returncode else ""
        except subprocess.TimeoutExpired:
            failed = f"still ran after the pod's grace of {seconds:g} s"
        except LocalModeError:
            return  # the pod is not running: nothing to run it in
        if failed:
            log.write(f"slonk local: {name}: the preStop hook {failed}\n".encode())


def stop_pods(
    cluster: Cluster,
    names: Sequence[str],
    progress: Callable[[str], None] = lambda _: None,
    *,
    hooks: bool = True,
) -> None:
    """Stop these pods together, as kubelet would: each one's preStop hook (unless `hooks` is
    false: a power-off), SIGTERM, SIGKILL once the pod's terminationGracePeriodSeconds are
    spent; then whatever else runs in their network namespaces (sidecars, an ssh session)."""

    def stop(name: str) -> None:
        pid = cluster.pid(name)
        if pid is not None:
            spec = read_pod_spec(cluster, name)
            grace = float(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
            deadline = time.monotonic() + grace
            if hooks and spec.get("preStop"):
                _pre_stop(cluster, name, spec["preStop"], grace)
            pods.stop(pid, max(deadline - time.monotonic(), TERM_EXTENSION_SECONDS))

    if not names:
        return
    started = time.monotonic()
    # A thread a pod: each waits out its own pod's grace, all at once.
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        list(pool.map(stop, names))
    kill_all([cluster.network.pod_netns(name) for name in names])
    shown = names[0] if len(names) == 1 else f"{len(names)} pods"
    progress(f"  stopped {shown} in {time.monotonic() - started:.1f} s")


def start_saved(cluster: Cluster, name: str) -> None:
    """Start a stopped pod again from its saved template (pod.json), as its StatefulSet
    would make it again."""
    _launch(cluster, name, read_pod_spec(cluster, name))


def restart_pod(cluster: Cluster, name: str, stop_only: bool = False) -> None:
    """Stop a pod (its preStop hook, SIGTERM, SIGKILL) and start it again from its template,
    as its StatefulSet would."""
    stop_pods(cluster, [name])
    if not stop_only:
        start_saved(cluster, name)


def write_hosts(cluster: Cluster, name: str, hosts: str) -> None:
    """Replace a running pod's /etc/hosts (on its own /etc layer) with one rename, as cluster
    DNS starts answering for a new Service: a reader sees the old file or the new one."""
    script = "cat > /etc/.hosts.slonk && mv -f /etc/.hosts.slonk /etc/hosts"
    result = subprocess.run(
        cluster.enter(name, ["/bin/sh", "-c", script]),
        input=hosts, capture_output=True, text=True, check=False, cwd="/",
    )  # fmt: skip
    if result.returncode:
        raise LocalModeError(f"pod {name}: cannot update /etc/hosts: {result.stderr.strip()}")
