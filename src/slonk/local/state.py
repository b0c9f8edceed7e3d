"""A local cluster's state directory, the one home of its layout, and `Cluster`, the handle
every part of local mode reads it through (the pods' record, pids, logs and templates).

Layout (everything local mode makes lives here or in /run/netns):
  cluster.json             the pods `up` and `upgrade` made: role and address
  values.yaml              the values in force: `up`'s, then every upgrade's over them
  ssh/                     the local client key and the login pods' known host keys
  configmaps/<name>/       projected ConfigMaps (kubelet's ..data layout)
  secrets/<name>/          projected Secrets, kept across `down` like Helm's kept Secrets
  volumes/<claim>/         PersistentVolumeClaims, kept across `down`
  pods/<pod>/              pod.json, log, log-start, pid, and the pod's writable layers
  apiserver/               the fake Kubernetes API server's TLS, tokens, rules, the chart's
                           StatefulSets and PDBs, its Nodes (nodes/), host address and log
  serviceaccounts/<name>/  what kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount
  prometheus/              with `up --prometheus`: its configuration, targets, log, pid and
                           host address (slonk.local.prometheus)
  prometheus-data/         its storage, kept across `down` like volumes
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slonk.files import write_atomically
from slonk.local import pod as pods
from slonk.local.manifests import LocalModeError, Mount
from slonk.local.network import NETNS_DIR, Network

DEFAULT_STATE_DIR = Path(os.environ.get("SLONK_STATE_DIR", "/var/lib/slonk/local"))


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

    @property
    def apiserver_dir(self) -> Path:
        return self.state_dir / "apiserver"

    @property
    def prometheus_dir(self) -> Path:
        return self.state_dir / "prometheus"

    @property
    def prometheus_data(self) -> Path:
        return self.state_dir / "prometheus-data"

    @property
    def removed_by_down(self) -> list[Path]:
        """What `down` removes (`up` makes it again); Secrets, volumes and Prometheus's data
        are kept."""
        dirs = ("pods", "configmaps", "apiserver", "serviceaccounts", "prometheus")
        return [
            *(self.state_dir / d for d in dirs),
            self.record_file,
            self.values_file,
        ]

    def configmap_dir(self, name: str) -> Path:
        return self.state_dir / "configmaps" / name

    def secret_dir(self, name: str) -> Path:
        return self.state_dir / "secrets" / name

    def serviceaccount_dir(self, name: str) -> Path:
        return self.state_dir / "serviceaccounts" / name

    def pod_dir(self, name: str) -> Path:
        return self.state_dir / "pods" / name

    def mount_source(self, mount: Mount, pod: str) -> Path:
        """Where a mount's source lives in the state directory."""
        return {
            "configmap": self.configmap_dir(mount.name),
            "secret": self.secret_dir(mount.name),
            "claim": self.state_dir / "volumes" / mount.name,
            "scratch": self.pod_dir(pod) / "scratch" / mount.name,
        }[mount.kind]

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


def write_pod_spec(cluster: Cluster, name: str, spec: Mapping[str, Any]) -> None:
    """The pod's template: what `restart` starts again, and `enter` takes the env from."""
    write_atomically(cluster.pod_dir(name) / "pod.json", json.dumps(spec, indent=1))


def read_pod_spec(cluster: Cluster, name: str) -> dict[str, Any]:
    return json.loads((cluster.pod_dir(name) / "pod.json").read_text())


def save_values(cluster: Cluster, user: Mapping[str, Any]) -> None:
    write_atomically(cluster.values_file, yaml.safe_dump(dict(user)), mode=0o600)


def write_record(cluster: Cluster, record: Mapping[str, Any]) -> None:
    write_atomically(cluster.record_file, json.dumps(record, indent=1))
