"""`slonk local upgrade`: `helm upgrade --reuse-values` for a running local cluster, which
kills no job and leaves nothing half-applied.

- Values compose: the new files layer over the values in force (`up`'s and every earlier
  upgrade's), which are saved only once the pods took the change.
- The new cluster.yaml is checked as the pods will check it before anything changes.
- The pod set changes as a StatefulSet's would. A new pod gets an address no pod holds, and
  every running pod's /etc/hosts answers for it before the controller hears of it. A pod
  leaves only if its Slurm node runs no job: one that does refuses the whole upgrade, naming
  it; the others are drained, so that no job lands meanwhile, and looked at again.
- The ConfigMaps are projected, then the controller's config-watch verdict on the change is
  read from its log. Anything but `applied` (refused, could not apply, no word in time) puts
  the ConfigMaps, hosts files, drains, namespaces and the cluster's record back as they were,
  and the upgrade fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slonk.kube import chart
from slonk.local import fake_apiserver, firewall, prometheus
from slonk.local.cluster import require_root
from slonk.local.kubelet import start_pods, stop_pods, write_hosts
from slonk.local.manifests import LocalModeError, Plan, Pod, hosts_file
from slonk.local.network import pod_addresses
from slonk.local.nodes import node_states, wait_nodes_up
from slonk.local.podspec import pod_spec
from slonk.local.projection import DATA_LINK, project, read
from slonk.local.release import SPEC_CONFIGMAP, known_hosts, project_secrets, render
from slonk.local.state import (
    Cluster,
    check_state_dir,
    read_pod_spec,
    save_values,
    write_pod_spec,
    write_record,
)
from slonk.slurm import reasons
from slonk.slurm.slurm_state import QUEUE, SlurmError, parse_jobs
from slonk.slurm.slurmctld import START_TIMEOUT_SECONDS

# The controller's verdict takes as long as slurmctld may take to run the new files (its own
# bound, for a re-execution or a restart) and a little more: given up sooner, a change the
# controller is still applying on a loaded machine would be put back under it.
VERDICT_TIMEOUT_SECONDS = START_TIMEOUT_SECONDS + 30.0
# After putting a change back: the watcher's word on that, if it has one (it has none when
# it never took the change), so that the next upgrade does not read it as its own.
ROLLBACK_VERDICT_SECONDS = 10.0
LEAVING_REASON = reasons.scale_down("pod leaving")
WATCH_PREFIX = "slonk watch-config: "
# The watcher's own line: at the start of a log line (podman's k8s-file log puts a time, the
# stream and a tag first), never in the middle of another daemon's message that may quote
# what a user typed.
WATCH_LINE = re.compile(r"(?:\S+ std(?:out|err) [FP] )?slonk watch-config: (?P<message>.*)")
VERDICT = re.compile(r"\b(applied|refused|could not)\b")


def verdict(line: str) -> tuple[str, str] | None:
    """config-watch's verdict on a cluster.yaml change in one pod log line: ('applied',
    'refused' or 'could not', the line), None for any other line. The words are those
    slonk.pod.config_watch logs; the first one in the message decides."""
    line = line.rstrip("\r\n")
    found = WATCH_LINE.fullmatch(line)
    word = VERDICT.search(found["message"]) if found else None
    return (word[1], f"{WATCH_PREFIX}{found['message']}") if found and word else None


@dataclass
class LogTail:
    """A pod log read from an offset, one complete line at a time."""

    path: Path
    offset: int = 0
    partial: bytes = b""

    def new_lines(self) -> list[str]:
        with open(self.path, "rb") as log:
            log.seek(self.offset)
            data = log.read()
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in lines]


def _controller(cluster: Cluster) -> str:
    """The controller pod whose log and Slurm commands count: the first that runs (with a
    backup, the primary's pod may be stopped and the backup in control)."""
    return cluster.running_controller() or cluster.pod_names("controller")[0]


def wait_verdict(cluster: Cluster, tail: LogTail, timeout: float) -> tuple[str, str] | None:
    """The first verdict in the controller's log past `tail`; None when none came within
    `timeout` or the controller pod stopped."""
    controller = _controller(cluster)
    deadline = time.monotonic() + timeout
    while True:
        for line in tail.new_lines():
            if found := verdict(line):
                return found
        if cluster.pid(controller) is None or time.monotonic() > deadline:
            return None
        time.sleep(0.1)


@contextlib.contextmanager
def _exclusive(cluster: Cluster) -> Iterator[None]:
    """One upgrade at a time: each reads the values and the verdict the last one left."""
    with open(cluster.state_dir / "upgrade.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalModeError(f"another upgrade of {cluster.state_dir} is running") from None
        yield


def _slurm(cluster: Cluster, *command: str) -> str:
    controller = _controller(cluster)
    result = cluster.run(controller, command)
    if result.returncode:
        raise LocalModeError(f"{' '.join(command)}: {result.stderr.strip() or 'failed'}")
    return result.stdout


def _refuse_busy(cluster: Cluster, nodes: Sequence[str]) -> None:
    """Refuse if a job holds one of `nodes`: one squeue for all of them."""
    if not nodes:
        return
    queue = _slurm(cluster, *QUEUE, f"--nodelist={','.join(nodes)}")
    try:
        jobs = parse_jobs(queue)
    except SlurmError as err:
        raise LocalModeError(f"cannot tell whether {', '.join(nodes)} run jobs: {err}; "
                             "nothing changed") from None  # fmt: skip
    busy: dict[str, list[str]] = {}
    for job in jobs:
        # squeue picked it for these nodes: a started one that shows no allocation holds
        # them all, as far as we can tell
        held = job.nodes or (() if job.state == "PENDING" else nodes)
        for node in held:
            if node in nodes:
                busy.setdefault(node, []).append(job.id)
    if busy:
        running = "; ".join(f"{node} runs job {', '.join(jobs)}" for node, jobs in busy.items())
        raise LocalModeError(
            f"cannot remove {', '.join(busy)}: {running}. Nothing changed; upgrade again once "
            "the jobs are done"
        )


def _hold_leaving(
    cluster: Cluster,
    leaving: Sequence[str],
    rollback: contextlib.ExitStack,
    progress: Callable[[str], None],
) -> None:
    """Refuse if a leaving pod's Slurm node runs a job; else drain those nodes, so that none
    lands on them from here, and look again for one that landed meanwhile. A node drained
    already is left as it is; ours are resumed on rollback if the drain is still ours."""
    workers = [name for name in leaving if name in cluster.pod_names("worker")]
    if not workers:
        return
    states = node_states(cluster)
    if not states:
        raise LocalModeError(
            f"the controller does not answer: cannot tell whether {', '.join(workers)} run "
            "jobs; nothing changed"
        )
    nodes = [name for name in workers if name in states]  # others never registered
    _refuse_busy(cluster, nodes)
    for node in nodes:
        if states[node].schedulable:
            _slurm(cluster, "scontrol", "update", f"nodename={node}", "state=drain",
                   f"reason={LEAVING_REASON}")  # fmt: skip
            rollback.callback(_resume, cluster, node)
            progress(f"  drained {node}: its pod leaves")
    _refuse_busy(cluster, nodes)


def _resume(cluster: Cluster, node: str) -> None:
    """Lift the drain only while it is still ours: the very reason, not a person's since."""
    state = node_states(cluster).get(node)
    if state is not None and state.drained and state.reason == LEAVING_REASON:
        _slurm(cluster, "scontrol", "update", f"nodename={node}", "state=resume")


def _read_configmap(folder: Path) -> dict[str, bytes] | None:
    return read(folder) if (folder / DATA_LINK).exists() else None


def _put_back(folder: Path, files: dict[str, bytes] | None) -> None:
    if files is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        project(folder, files)


def _project_configmaps(
    cluster: Cluster,
    configmaps: Mapping[str, Mapping[str, bytes]],
    rollback: contextlib.ExitStack,
    progress: Callable[[str], None],
) -> set[str]:
    """Project each ConfigMap that changed (kubelet's atomic swap); returns their names."""
    changed = set()
    for name, files in configmaps.items():
        folder = cluster.configmap_dir(name)
        before = _read_configmap(folder)
        if before == dict(files):
            continue
        if name == SPEC_CONFIGMAP:
            rollback.callback(_put_back_spec, cluster, folder, before, progress)
        else:
            rollback.callback(_put_back, folder, before)
        project(folder, files)
        changed.add(name)
        progress(f"  updated ConfigMap {name}")
    return changed


def _put_back_spec(
    cluster: Cluster, folder: Path, files: dict[str, bytes] | None, progress: Callable[[str], None]
) -> None:
    tail = _controller_tail(cluster)
    _put_back(folder, files)
    progress(f"  put back ConfigMap {SPEC_CONFIGMAP}")
    found = wait_verdict(cluster, tail, ROLLBACK_VERDICT_SECONDS)
    if found:
        progress(f"  {_controller(cluster)}: {found[1]}")


def _controller_tail(cluster: Cluster) -> LogTail:
    """The controller's log from its end now: what config-watch says from here on."""
    controller = _controller(cluster)
    return LogTail(cluster.log_file(controller), cluster.log_offset(controller))


def _await_controller(cluster: Cluster, tail: LogTail, progress: Callable[[str], None]) -> None:
    """The controller's verdict on the new cluster.yaml; anything but applied fails."""
    controller = _controller(cluster)
    found = wait_verdict(cluster, tail, VERDICT_TIMEOUT_SECONDS)
    if found is None:
        why = (
            "its pod stopped"
            if cluster.pid(controller) is None
            else (f"no word within {VERDICT_TIMEOUT_SECONDS:.0f} s")
        )
        raise LocalModeError(f"{controller} did not confirm the change ({why}); put back")
    word, message = found
    progress(f"  {controller}: {message}")
    if word != "applied":
        raise LocalModeError(f"{controller} did not take the change ({word}); put back")


def _update_hosts(
    cluster: Cluster, names: Sequence[str], hosts: str, rollback: contextlib.ExitStack
) -> None:
    """Every running pod that stays answers for the new pod set's names."""
    for name in names:
        before = read_pod_spec(cluster, name)["files"]["/etc/hosts"]
        if before != hosts and cluster.pid(name) is not None:
            rollback.callback(write_hosts, cluster, name, before)
            write_hosts(cluster, name, hosts)


def _check_pod_set(
    record: Mapping[str, Any], joining: Sequence[Pod], leaving: Sequence[str]
) -> None:
    if not joining and not leaving:
        return
    roles = [p.role for p in joining] + [record["pods"][n]["role"] for n in leaving]
    if "controller" in roles:
        raise LocalModeError(
            "an upgrade cannot replace the controller: `down` and `up`; nothing changed"
        )
    if record.get("runtime", "host") != "host":
        raise LocalModeError(
            "pods from images (podman) cannot be added or removed by an upgrade, since their "
            "/etc/hosts cannot change: `down` and `up`; nothing changed"
        )


def upgrade(
    state_dir: Path, value_files: Sequence[Path] = (), progress: Callable[[str], None] = print
) -> None:
    require_root()
    cluster = Cluster(check_state_dir(state_dir).resolve())
    with _exclusive(cluster):
        record = cluster.record()
        # The values in force, checked (an empty file is refused, never read as no values),
        # then each new file over them in turn, as `helm upgrade --reuse-values -f`.
        new = (chart.user_values([path]) for path in value_files)
        user = functools.reduce(chart.deep_merge, new, cluster.values())
        objects, spec = render(cluster, user)
        new_names = [p.name for p in objects.pods]
        joining = [p for p in objects.pods if p.name not in record["pods"]]
        leaving = [name for name in record["pods"] if name not in new_names]
        staying = [name for name in record["pods"] if name in new_names]
        _check_pod_set(record, joining, leaving)
        addresses = pod_addresses(
            new_names, {name: record["pods"][name]["address"] for name in staying}
        )
        hosts = hosts_file(objects, addresses, spec.cluster_domain)
        # Every pod's new template, made before anything changes: one local mode cannot
        # run (a sidecar it has no stand-in for) fails here.
        runtime = record.get("runtime", "host")
        templates = {p.name: pod_spec(cluster, p, hosts, runtime) for p in objects.pods}
        with contextlib.ExitStack() as rollback:
            _hold_leaving(cluster, leaving, rollback, progress)
            _make_room(cluster, record, joining, addresses, rollback)
            _update_hosts(cluster, staying, hosts, rollback)
            tail = _controller_tail(cluster)
            if SPEC_CONFIGMAP in _project_configmaps(
                cluster, objects.configmaps, rollback, progress
            ):
                _await_controller(cluster, tail, progress)
            rollback.pop_all()  # the pods took it: from here on, the change stays
        save_values(cluster, user)
        _settle(cluster, objects, templates, joining, leaving, progress)
        if prometheus.enabled(cluster):
            prometheus.write_targets(cluster, spec)  # the pod set and metrics.port in force
    progress("slonk local: upgraded")


def _make_room(
    cluster: Cluster,
    record: Mapping[str, Any],
    joining: Sequence[Pod],
    addresses: Mapping[str, str],
    rollback: contextlib.ExitStack,
) -> None:
    """Network namespaces for the joining pods, in the record first (so that `down` removes
    them whatever happens next)."""
    if not joining:
        return
    rollback.callback(write_record, cluster, dict(record))
    pods = dict(record["pods"])
    pods.update({p.name: {"role": p.role, "address": addresses[p.name]} for p in joining})
    write_record(cluster, {**record, "pods": pods})
    for pod in joining:
        rollback.callback(cluster.network.remove_pod, pod.name)
        cluster.network.add_pod(pod.name, addresses[pod.name])


def _settle(
    cluster: Cluster,
    objects: Plan,
    templates: Mapping[str, dict[str, Any]],
    joining: Sequence[Pod],
    leaving: Sequence[str],
    progress: Callable[[str], None],
) -> None:
    """After the controller took the new configuration: stop the leaving pods, give staying
    ones their new template (they take it when next started, as with OnDelete), start the
    joining ones and wait until their nodes are up."""
    stop_pods(cluster, leaving, progress)
    for name in leaving:
        cluster.network.remove_pod(name)
        shutil.rmtree(cluster.pod_dir(name), ignore_errors=True)
    record = cluster.record()
    record["pods"] = {n: p for n, p in record["pods"].items() if n not in leaving}
    write_record(cluster, record)
    project_secrets(cluster, objects)
    addresses = {name: pod["address"] for name, pod in record["pods"].items()}
    known_hosts(cluster, objects, addresses)
    # The new pod set's addresses and the new policies, before a joining pod runs.
    firewall.enforce(cluster.network, objects, addresses)
    joined = {p.name for p in joining}
    for name, template in templates.items():
        if name not in joined:
            write_pod_spec(cluster, name, template)
    start_pods(cluster, [(pod, templates[pod.name]) for pod in joining], progress)
    # The fake API's StatefulSets take the chart's replicas and templates now that the pods
    # match them: it starts only a pod a `kubectl scale` had stopped.
    fake_apiserver.publish(cluster, objects)
    if joining:
        wait_nodes_up(cluster, progress=progress, pods=[p.name for p in joining])
