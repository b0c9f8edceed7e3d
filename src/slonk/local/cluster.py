"""`slonk local`: render the chart, run every StatefulSet replica as a pod, manage them.

State directory layout (everything local mode makes lives here or in /run/netns):
  cluster.json             the pods `up` and `upgrade` made: role and address
  values.yaml              the values in force: `up`'s, then every upgrade's over them
  ssh/                     the local client key and the login pods' known host keys
  configmaps/<name>/       projected ConfigMaps (kubelet's ..data layout)
  secrets/<name>/          projected Secrets, kept across `down` like Helm's kept Secrets
  volumes/<claim>/         PersistentVolumeClaims, kept across `down`
  pods/<pod>/              pod.json, log, pid, and the pod's writable layers
  apiserver/               the fake Kubernetes API server's TLS, tokens, rules, nodes and log
  serviceaccounts/<name>/  what kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import slonk
from slonk import chart, paths
from slonk.config.spec import ClusterSpec, SpecError, parse_spec
from slonk.files import write_atomically
from slonk.local import fake_apiserver, podman
from slonk.local import pod as pods
from slonk.local.manifests import LocalModeError, Plan, Pod, hosts_file, plan, state_path
from slonk.local.network import (
    BRIDGE_ADDRESS,
    NETNS_DIR,
    Network,
    is_mount_point,
    pod_addresses,
    processes_in,
)
from slonk.local.projection import project
from slonk.slurm_state import SHOW_NODES, NodeState, SlurmError, parse_nodes

RELEASE = "slonk"
NAMESPACE = "default"
SPEC_CONFIGMAP = f"{RELEASE}-cluster"
SPEC_KEY = "cluster.yaml"
LOCAL_VALUES = Path(__file__).with_name("values.yaml")
DEFAULT_STATE_DIR = Path(os.environ.get("SLONK_STATE_DIR", "/var/lib/slonk/local"))
STOP_GRACE_SECONDS = 15.0
NODES_UP_TIMEOUT_SECONDS = 120.0
POD_TMPFS = {"/run": "0755", "/tmp": "1777"}
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Cluster:
    """A local cluster, known by its state directory."""

    state_dir: Path

    @property
    def network(self) -> Network:
        return Network.for_state_dir(self.state_dir)

    @property
    def client_key(self) -> Path:
        return self.state_dir / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "ssh" / "known_hosts"

    @property
    def values_file(self) -> Path:
        """The values in force: `up`'s, then each upgrade's layered over them."""
        return self.state_dir / "values.yaml"

    @property
    def record_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def pod_dir(self, name: str) -> Path:
        return self.state_dir / "pods" / name

    def log_file(self, name: str) -> Path:
        """The pod's log: every container's output since `up`, each restart's after the last."""
        return self.pod_dir(name) / "log"

    def log_offset(self, name: str) -> int:
        """Where the pod's log ends now: what the pod logs from here on lies past it, for
        `log(name, since=...)` (a byte offset)."""
        try:
            return self.log_file(name).stat().st_size
        except FileNotFoundError:
            return 0

    def mark_container_start(self, name: str) -> None:
        """Before a container of the pod starts: its log begins where the pod's ends now."""
        (self.pod_dir(name) / "log-start").write_text(f"{self.log_offset(name)}\n")

    def container_log_offset(self, name: str) -> int:
        """Where the log of the pod's current container (its last start) begins."""
        try:
            start = int((self.pod_dir(name) / "log-start").read_text())
        except (OSError, ValueError):
            return 0
        # A log that shrank was started afresh: all of it is the current container's.
        return start if start <= self.log_offset(name) else 0

    def log(self, name: str, since: int = 0) -> str:
        """The pod's log from byte offset `since` (a `log_offset` or `container_log_offset`),
        by default all of it; "" while there is none."""
        try:
            with open(self.log_file(name), "rb") as log:
                log.seek(since)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def record(self) -> dict[str, Any]:
        try:
            return json.loads(self.record_file.read_text())
        except FileNotFoundError:
            raise LocalModeError(
                f"no local cluster in {self.state_dir}: run `slonk local up`"
            ) from None

    def pod_names(self, role: str | None = None) -> list[str]:
        return [n for n, p in self.record()["pods"].items() if role in (None, p["role"])]

    def address(self, name: str) -> str:
        return self.record()["pods"][name]["address"]

    def pid(self, name: str) -> int | None:
        return pods.running_pid(self.pod_dir(name), self.network.pod_netns(name))

    def enter(self, name: str, command: Sequence[str]) -> list[str]:
        """argv running `command` in pod `name`, with the pod's environment."""
        pid = self.pid(name)
        if pid is None:
            raise LocalModeError(f"pod {name} is not running")
        env = read_pod_spec(self, name)["env"]
        return pods.enter(pid, command, env)

    def run(self, name: str, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.enter(name, command), capture_output=True, text=True, check=False, cwd="/"
        )

    def ssh(self, user: str, command: Sequence[str] = ()) -> list[str]:
        """argv for ssh to the first login pod as `user`, from the cluster's network."""
        login = self.pod_names("login")
        if not login:
            raise LocalModeError("this cluster has no login pod (login.replicas is 0)")
        return [
            "nsenter",
            f"--net={NETNS_DIR / self.network.switch}",
            "--",
            "ssh",
            "-i",
            str(self.client_key),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "LogLevel=ERROR",
            f"{user}@{self.address(login[0])}",
            *command,
        ]


def require_root() -> None:
    if os.geteuid() != 0:
        raise LocalModeError("slonk local needs root: it makes network namespaces and mounts")


def _client_key(cluster: Cluster) -> str:
    if not cluster.client_key.exists():
        cluster.client_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "slonk-local",
                "-f",
                str(cluster.client_key),
            ],
            check=True,
        )
    return cluster.client_key.with_suffix(".pub").read_text().strip()


def values(cluster: Cluster, user: Mapping[str, Any]) -> dict[str, Any]:
    """Chart values for local mode: its defaults, then the user's. Users without keys,
    static or in the development directory, get the local client key for `slonk local ssh`."""
    merged = chart.deep_merge(chart.user_values([LOCAL_VALUES]), copy.deepcopy(user))
    key = _client_key(cluster)

    def with_key(users: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"sshKeys": [key], **u} for u in users]

    merged["users"] = with_key(merged.get("users", []))
    dev = merged.get("ldap", {}).get("dev", {})
    if dev.get("users"):
        dev["users"] = with_key(dev["users"])
    return merged


def configmap_dir(cluster: Cluster, name: str) -> Path:
    return cluster.state_dir / "configmaps" / name


def project_objects(cluster: Cluster, objects: Plan) -> None:
    for name, files in objects.configmaps.items():
        project(configmap_dir(cluster, name), files)
    project_secrets(cluster, objects)


def project_secrets(cluster: Cluster, objects: Plan) -> None:
    for name, files in objects.secrets.items():
        target = cluster.state_dir / "secrets" / name
        if not (target / "..data").exists():  # like the chart's `lookup`: made once, kept
            project(target, files, mode=0o400)


def known_hosts(cluster: Cluster, objects: Plan, addresses: dict[str, str]) -> None:
    lines = []
    for pod in objects.pods:
        for mount in pod.mounts:
            if mount.kind == "secret" and mount.target == str(paths.SSH_SECRET_DIR):
                for key in sorted(state_path(cluster.state_dir, mount, pod.name).glob("*_key")):
                    public = subprocess.run(
                        ["ssh-keygen", "-y", "-f", str(key)],
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout.strip()
                    lines.append(f"{addresses[pod.name]} {public}")
    cluster.known_hosts.write_text("".join(f"{line}\n" for line in lines))


def _development_binds(layers: Sequence[str]) -> list[dict[str, Any]]:
    """From a checkout, its code in place of the image's copy (so that a change needs no
    image rebuild), and the checkout itself read-only at its own path (values may name its
    files: the tests' fake nvidia-smi). Nothing when slonk runs from an install."""
    checkout = paths.checkout()
    if checkout is None:
        return []
    installed = [
        str(Path("/", *p.relative_to(layer).parts))
        for layer in layers
        for p in Path(layer).glob("opt/slonk/lib/python3*/site-packages/slonk")
    ]
    if not installed:
        raise LocalModeError("the image has no slonk in /opt/slonk (scripts/build-images)")
    code = Path(slonk.__file__).parent
    return [
        {"source": str(checkout), "target": str(checkout), "readOnly": True},
        {"source": str(code), "target": installed[0], "readOnly": True},
    ]


# Asked once per image, not per pod (a podman call each): `up` and `upgrade` are one short
# command, and the images do not change under it.
_image_layers = functools.cache(podman.image_layers)


def pod_spec(cluster: Cluster, pod: Pod, hosts: str, runtime: str) -> dict[str, Any]:
    layers: list[str] = _image_layers(pod.image) if runtime == "host" else []
    rootfs = paths.rootfs_dir() if paths.checkout() else None
    binds = _development_binds(layers) if runtime == "host" else []
    # What a host-runtime pod binds from the checkout must not show it the state directory.
    for bind in binds:
        if cluster.state_dir.is_relative_to(bind["source"]):
            raise LocalModeError(
                f"state dir {cluster.state_dir} lies in {bind['source']}, which pods see: "
                "choose another"
            )
    for mount in pod.mounts:
        source = state_path(cluster.state_dir, mount, pod.name)
        binds.append({"source": str(source), "target": mount.target, "readOnly": mount.read_only})
    env = {"PATH": POD_PATH, "HOME": "/root", "LANG": "C.UTF-8", **pod.env}
    if pod.service_account:
        account = cluster.state_dir / "serviceaccounts" / pod.service_account
        binds.append({"source": str(account), "target": SERVICE_ACCOUNT_DIR, "readOnly": True})
        env |= {
            "KUBERNETES_SERVICE_HOST": BRIDGE_ADDRESS,
            "KUBERNETES_SERVICE_PORT": str(fake_apiserver.PORT),
        }
    pod_layers = cluster.pod_dir(pod.name) / "layers"
    return {
        "hostname": pod.name,
        "image": pod.image,
        "capabilities": list(pod.capabilities),
        "dropCapabilities": list(pod.drop_capabilities),
        "noNewPrivileges": pod.no_new_privileges,
        "command": list(pod.command),
        "env": env,
        # Host runtime: the image's layers under the pod's own (from a checkout, its rootfs/
        # on top, as the images' last layer copies it), mounted at `target` and pivoted into.
        "root": {
            "lower": [*([str(rootfs)] if rootfs else []), *layers],
            "upper": str(pod_layers / "upper"),
            "work": str(pod_layers / "work"),
            "target": str(pod_layers / "root"),
        },
        "tmpfs": POD_TMPFS,
        "binds": binds,
        "files": {"/etc/hosts": hosts, "/etc/hostname": f"{pod.name}\n"},
        "sidecars": _sidecar_specs(cluster, pod),
    }


# Sidecar images local mode can stand in for, and the module that does it (see its docstring).
SIDECAR_STAND_INS = {"git-sync": "slonk.local.gitsync"}


def _sidecar_specs(cluster: Cluster, pod: Pod) -> list[dict[str, Any]]:
    """Each sidecar as a local stand-in process: its env, with volume paths made host paths."""
    specs = []
    for sidecar in pod.sidecars:
        module = next((m for image, m in SIDECAR_STAND_INS.items() if image in sidecar.image), None)
        if module is None:
            raise LocalModeError(
                f"pod {pod.name}: local mode cannot run sidecar {sidecar.name} ({sidecar.image})"
            )
        env = dict(sidecar.env)
        for mount in sidecar.mounts:
            host = str(state_path(cluster.state_dir, mount, pod.name))
            env = {k: v.replace(mount.target, host) for k, v in env.items()}
        specs.append({"name": sidecar.name, "module": module, "env": env})
    return specs


def _start_sidecars(cluster: Cluster, name: str, sidecars: list[dict[str, Any]]) -> None:
    """Sidecars run in the pod's network namespace: `down` and `restart` stop them with it."""
    for sidecar in sidecars:
        with open(cluster.pod_dir(name) / f"{sidecar['name']}.log", "ab") as log:
            subprocess.Popen(
                [
                    "nsenter",
                    f"--net={NETNS_DIR / cluster.network.pod_netns(name)}",
                    "--",
                    sys.executable,
                    "-m",
                    sidecar["module"],
                ],
                env={"PATH": POD_PATH, **sidecar["env"]},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def write_pod_spec(cluster: Cluster, name: str, spec: Mapping[str, Any]) -> None:
    """The pod's template: what `restart` starts again, and `enter` takes the env from."""
    write_atomically(cluster.pod_dir(name) / "pod.json", json.dumps(spec, indent=1))


def read_pod_spec(cluster: Cluster, name: str) -> dict[str, Any]:
    return json.loads((cluster.pod_dir(name) / "pod.json").read_text())


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
    write_pod_spec(cluster, name, spec)
    cluster.mark_container_start(name)
    if cluster.record().get("runtime") == "podman":
        pid = podman.start(pod_dir, netns, spec)
    else:
        pid = pods.start(pod_dir, netns)
    (pod_dir / "pid").write_text(f"{pid}\n")
    _start_sidecars(cluster, name, spec["sidecars"])
    return pid


def node_states(cluster: Cluster) -> dict[str, NodeState]:
    """Slurm's state of every node, as the controller sees it ({} while it does not answer).
    Output that cannot be read is an error, never an empty answer."""
    controller = cluster.pod_names("controller")
    if not controller or cluster.pid(controller[0]) is None:
        return {}
    result = cluster.run(controller[0], list(SHOW_NODES))
    if result.returncode != 0:
        return {}
    try:
        return {node.name: node for node in parse_nodes(result.stdout)}
    except SlurmError as err:
        raise LocalModeError(str(err)) from None


def wait_nodes_up(
    cluster: Cluster,
    timeout: float = NODES_UP_TIMEOUT_SECONDS,
    progress: Callable[[str], None] = print,
    pods: Sequence[str] | None = None,
) -> float:
    """Wait until the worker pods among `pods` (default: every pod) are registered, responding
    Slurm nodes; returns the seconds it took. Fails as soon as one of `pods` or the controller
    stops, or after `timeout` naming each node's state."""
    started = time.monotonic()
    watched = set(cluster.pod_names() if pods is None else pods)
    watched |= set(cluster.pod_names("controller"))
    expected = watched & set(cluster.pod_names("worker"))
    last = None
    while True:
        for name in sorted(watched):
            if cluster.pid(name) is None:
                log = cluster.log(name).splitlines()[-15:]
                raise LocalModeError(f"pod {name} stopped while starting:\n" + "\n".join(log))
        states = node_states(cluster)
        summary = ", ".join(
            f"{n} {states[n].label if n in states else 'not registered'}" for n in sorted(expected))
        if summary != last:
            progress(f"  nodes: {summary or 'none'}")
            last = summary
        if all(n in states and states[n].up for n in expected):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise LocalModeError(f"nodes not up after {timeout:.0f} s: {summary}")
        time.sleep(0.05)


def render(cluster: Cluster, user: Mapping[str, Any]) -> tuple[Plan, ClusterSpec]:
    """The chart's objects for these user values, and the cluster.yaml they carry, checked
    as every pod will check it: values the pods would refuse fail here, before anything is
    made or changed."""
    rendered = chart.render(chart.default_chart(), values(cluster, user), RELEASE, NAMESPACE)
    docs = [d for d in yaml.load_all(chart.manifest(rendered), Loader=yaml.CSafeLoader) if d]
    objects = plan(docs, NAMESPACE)
    return objects, cluster_spec(objects)


def cluster_spec(objects: Plan) -> ClusterSpec:
    """The spec in the rendered ConfigMap, parsed as the pods parse it (SpecError naming the
    ConfigMap and the key)."""
    where = f"ConfigMap {SPEC_CONFIGMAP}, {SPEC_KEY}"
    try:
        data = yaml.safe_load(objects.configmaps[SPEC_CONFIGMAP][SPEC_KEY])
    except yaml.YAMLError as err:
        raise SpecError(f"{where}: not valid YAML: {err}") from err
    try:
        return parse_spec(data)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from err


def save_values(cluster: Cluster, user: Mapping[str, Any]) -> None:
    write_atomically(cluster.values_file, yaml.safe_dump(dict(user)), mode=0o600)


def write_record(cluster: Cluster, record: Mapping[str, Any]) -> None:
    write_atomically(cluster.record_file, json.dumps(record, indent=1))


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


def start_pod(
    cluster: Cluster, pod: Pod, spec: dict[str, Any], progress: Callable[[str], None]
) -> None:
    cluster.pod_dir(pod.name).mkdir(parents=True, exist_ok=True)
    _launch(cluster, pod.name, spec)
    progress(f"  started {pod.name} ({pod.role}) at {cluster.address(pod.name)}")


def up(
    state_dir: Path,
    value_files: Sequence[Path] = (),
    progress: Callable[[str], None] = print,
    runtime: str = "host",
) -> Cluster:
    """Start the chart's pods; `runtime` host runs them on the host's files with rootfs/
    layered over, podman from the images the chart names (slonk.local.podman)."""
    require_root()
    cluster = Cluster(state_dir.resolve())
    if cluster.record_file.exists() and any(cluster.pid(n) for n in cluster.pod_names()):
        raise LocalModeError(f"a cluster is already up in {state_dir}: `slonk local down` first")
    cluster.state_dir.mkdir(parents=True, exist_ok=True)
    # It holds the controller's API token and the cluster's keys: root's alone.
    cluster.state_dir.chmod(0o700)
    started = time.monotonic()
    user = chart.user_values(value_files)
    objects, spec = render(cluster, user)
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
            "pods": {p.name: {"role": p.role, "address": addresses[p.name]} for p in objects.pods},
        },
    )
    network.create_switch()
    for p in objects.pods:
        network.add_pod(p.name, addresses[p.name])
    known_hosts(cluster, objects, addresses)
    fake_apiserver.start(cluster.state_dir, cluster.network.switch, objects, NAMESPACE)
    hosts = hosts_file(objects, addresses, spec.cluster_domain)
    for p in objects.pods:
        start_pod(cluster, p, pod_spec(cluster, p, hosts, runtime), progress)
    wait_nodes_up(cluster, progress=progress)
    progress(f"slonk local: cluster up in {time.monotonic() - started:.2f} s")
    return cluster


def restart(state_dir: Path, name: str, stop_only: bool = False) -> None:
    """Stop a pod (as kubelet would: SIGTERM, then SIGKILL) and start it again."""
    require_root()
    cluster = Cluster(state_dir.resolve())
    if name not in cluster.pod_names():
        raise LocalModeError(f"no pod {name!r}: pods are {', '.join(cluster.pod_names())}")
    stop_pods(cluster, [name])
    if not stop_only:
        _launch(cluster, name, read_pod_spec(cluster, name))


def _kill_all(netns: str) -> None:
    for pid in processes_in(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_pods(
    cluster: Cluster, names: Sequence[str], progress: Callable[[str], None] = lambda _: None
) -> None:
    """Stop these pods together, as kubelet would (SIGTERM, SIGKILL after the grace), then
    whatever else runs in their network namespaces (sidecars, an ssh session)."""

    def stop(name: str) -> None:
        pid = cluster.pid(name)
        if pid is not None:
            pods.stop(pid, STOP_GRACE_SECONDS)
            progress(f"  stopped {name}")
        _kill_all(cluster.network.pod_netns(name))

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        list(pool.map(stop, names))


def stop_order(roles: Mapping[str, str]) -> list[list[str]]:
    """Pods by role ({name: role}) in the waves `down` stops them: every other pod before the
    controller, so that each worker, stopping, marks its node down (its jobs requeued)
    while the controller still runs, and the controller saves that state as it stops."""
    others = [name for name, role in roles.items() if role != "controller"]
    controllers = [name for name, role in roles.items() if role == "controller"]
    return [wave for wave in (others, controllers) if wave]


def down(state_dir: Path, purge: bool = False, progress: Callable[[str], None] = print) -> None:
    """Stop every pod and remove every namespace, even after a partial `up`. Idempotent."""
    require_root()
    cluster = Cluster(state_dir.resolve())
    network = cluster.network
    record = cluster.record() if cluster.record_file.exists() else {"pods": {}}
    for wave in stop_order({name: pod["role"] for name, pod in record["pods"].items()}):
        stop_pods(cluster, wave, progress)
    if record.get("runtime") == "podman":
        for name in record["pods"]:
            podman.remove(network.pod_netns(name))
    for netns in network.namespaces():
        _kill_all(netns)  # the fake API server, a pod that never finished starting
    network.destroy(made_netns_mount=record.get("made_netns_mount", False))
    if purge:
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
    else:
        shutil.rmtree(cluster.state_dir / "pods", ignore_errors=True)
        shutil.rmtree(cluster.state_dir / "configmaps", ignore_errors=True)
        shutil.rmtree(cluster.state_dir / "apiserver", ignore_errors=True)
        shutil.rmtree(cluster.state_dir / "serviceaccounts", ignore_errors=True)
        cluster.record_file.unlink(missing_ok=True)
        cluster.values_file.unlink(missing_ok=True)
    progress(f"slonk local: down ({'state removed' if purge else 'volumes and secrets kept'})")


def status(state_dir: Path) -> str:
    cluster = Cluster(state_dir.resolve())
    rows = [f"{'POD':24} {'ROLE':10} {'ADDRESS':12} {'STATE':8} PROCESSES"]
    for name, info in cluster.record()["pods"].items():
        pid = cluster.pid(name)
        procs = []
        if pid is not None:
            for p in sorted(processes_in(cluster.network.pod_netns(name))):
                try:
                    procs.append(Path(f"/proc/{p}/comm").read_text().strip())
                except OSError:
                    continue
        state = "Running" if pid else "Stopped"
        rows.append(f"{name:24} {info['role']:10} {info['address']:12} {state:8} {' '.join(procs)}")
    states = node_states(cluster)
    rows.append("")
    rows.append("Slurm nodes: "
                + (", ".join(f"{n} {s.label}" for n, s in states.items()) or "unknown"))
    return "\n".join(rows)
