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
  upgrade.lock             held by the one `upgrade` running

It holds the controller's API token and the cluster's keys, and its Secrets are kept across
`down`: a directory another user owns or can write (or a link they planted) would let them
read those and plant a munge key. So every command refuses one (check_state_dir) rather than
chmod or chown it. Its files are checked as read back (slonk.local.statefiles).
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slonk.base.files import write_atomically
from slonk.config import accounts
from slonk.local import pod as pods
from slonk.local.manifests import LocalModeError, Mount
from slonk.local.network import NETNS_DIR, Network
from slonk.local.statefiles import is_pod_name, load_pod_spec, load_record, load_values

DEFAULT_STATE_DIR = Path(os.environ.get("SLONK_STATE_DIR", "/var/lib/slonk/local"))
# What a state directory may hold: the layout above. write_atomically's temporary files
# (".cluster.json.XXXX") are what a crash mid-write leaves of the first two.
LAYOUT = frozenset(
    {"cluster.json", "values.yaml", "upgrade.lock", "ssh", "configmaps", "secrets", "volumes",
     "pods", "apiserver", "serviceaccounts", "prometheus", "prometheus-data"}
)  # fmt: skip
ATOMIC_LEFTOVERS = (".cluster.json.", ".values.yaml.")
# Kept across `down` and holding keys: every entry in them must be root's too.
KEPT_KEYS = ("secrets", "ssh")


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
        """cluster.json, checked whole and against the pods' templates (a StateFileError)."""
        try:
            return load_record(self.record_file, self.state_dir / "pods")
        except FileNotFoundError:
            raise LocalModeError(
                f"no local cluster in {self.state_dir}: run `slonk local up`"
            ) from None

    def values(self) -> dict[str, Any]:
        """The values in force (values.yaml), checked: never an empty file read as none."""
        return load_values(self.values_file)

    def check_pod(self, name: str) -> str:
        """`name`, refused unless it is one of the cluster's pods (names a person typed)."""
        names = self.pod_names()
        if not is_pod_name(name) or name not in names:
            raise LocalModeError(f"no pod {accounts.show(name)}: pods are {', '.join(names)}")
        return name

    def pod_names(self, role: str | None = None) -> list[str]:
        return [n for n, p in self.record()["pods"].items() if role in (None, p["role"])]

    def running_controller(self) -> str | None:
        """The first controller pod that runs (with a backup, the primary may be stopped):
        where Slurm's commands are run from, whichever slurmctld is in control."""
        return next((n for n in self.pod_names("controller") if self.pid(n) is not None), None)

    def address(self, name: str) -> str:
        return self.record()["pods"][name]["address"]

    def pid(self, name: str) -> int | None:
        return pods.running_pid(self.pod_dir(name), self.network.pod_netns(name))

    def enter(self, name: str, command: Sequence[str]) -> list[str]:
        """argv running `command` in pod `name`, with the pod's environment."""
        pid = self.pid(self.check_pod(name))
        if pid is None:
            raise LocalModeError(f"pod {name} is not running")
        return pods.enter(pid, command, read_pod_spec(self, name))

    def run(self, name: str, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.enter(name, command), capture_output=True, text=True, check=False, cwd="/"
        )

    def ssh(self, user: str, command: Sequence[str] = ()) -> list[str]:
        """argv for ssh to the first login pod as `user`, from the cluster's network. `user`
        is an account name (never an ssh option), and `--` ends ssh's options: ssh reads
        options again after the destination, so `command` could otherwise add one
        (`-oProxyCommand=...` runs on the host, as root)."""
        try:
            accounts.check_name(user, "user name")
        except accounts.AccountError as err:
            raise LocalModeError(f"user: {err}") from None
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
            "--",
            f"{user}@{self.address(login[0])}",
            *command,
        ]


def write_pod_spec(cluster: Cluster, name: str, spec: Mapping[str, Any]) -> None:
    """The pod's template: what `restart` starts again, and `enter` takes the env from."""
    write_atomically(cluster.pod_dir(name) / "pod.json", json.dumps(spec, indent=1))


def read_pod_spec(cluster: Cluster, name: str) -> dict[str, Any]:
    return load_pod_spec(cluster.pod_dir(name) / "pod.json", name)


def save_values(cluster: Cluster, user: Mapping[str, Any]) -> None:
    write_atomically(cluster.values_file, yaml.safe_dump(dict(user)), mode=0o600)


def write_record(cluster: Cluster, record: Mapping[str, Any]) -> None:
    write_atomically(cluster.record_file, json.dumps(record, indent=1))


class StateDirError(LocalModeError):
    """A state directory root does not hold alone: refused, nothing done in it."""


def check_state_dir(state_dir: Path) -> Path:
    """`state_dir` as an absolute path, refused (StateDirError) unless root's alone: not a
    symbolic link; it, or the nearest directory above it where `up` would make it, owned by
    root and writable by nobody else; every directory above owned by root and writable by
    others only with the sticky bit (as /tmp); holding nothing but a state dir's entries,
    each root's (and so every entry of the kept secrets/ and ssh/). Links are never followed
    (lstat); a root-owned link above it is checked where it leads as well."""
    path = Path(os.path.abspath(state_dir))
    try:
        accounts.check_path(str(path), "state dir")  # it reaches ssh's command line
    except accounts.AccountError as err:
        raise StateDirError(str(err)) from None
    own = _lstat(path)
    if own is not None and stat.S_ISLNK(own.st_mode):
        raise StateDirError(
            f"state dir {path} is a symbolic link (to {os.readlink(path)}), which its owner "
            "could point anywhere: give the directory itself"
        )
    if own is not None and not stat.S_ISDIR(own.st_mode):
        raise StateDirError(f"state dir {path} is not a directory")
    for chain in dict.fromkeys((path, Path(os.path.realpath(path)))):
        _check_chain(path, chain)
    if own is not None:
        _check_entries(path)
    return path


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_chain(state_dir: Path, path: Path) -> None:
    """Every existing directory from / down to `path`; the last is where `up` makes
    things (the state dir, or the one it is made in), and must be writable by root alone."""
    found = [(p, st) for p in (*reversed(path.parents), path) if (st := _lstat(p))]
    for i, (folder, st) in enumerate(found):
        _check_owned(state_dir, folder, st, sticky_ok=i < len(found) - 1)


def _check_owned(state_dir: Path, path: Path, st: os.stat_result, sticky_ok: bool) -> None:
    where = f"state dir {state_dir}" + ("" if path == state_dir else f": {path}")
    if st.st_uid != 0:
        raise StateDirError(
            f"{where} is owned by {_owner(st.st_uid)}, not root: that user could read the "
            "cluster's API token and keys, or plant its munge key. Nothing done; remove it "
            "or choose a directory root made (install -d -m 0700 DIR)"
        )
    if stat.S_ISLNK(st.st_mode):
        return  # root's own link: check_state_dir checks where it leads
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise StateDirError(
            f"{where} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"they could replace what root makes there. Nothing done; `chmod go-w {path}` "
            "or choose another"
        )


def _check_entries(state_dir: Path) -> None:
    """Only a state dir's entries (`--state-dir /etc` must not be chmod 0700 by `up`, nor
    removed by `down --purge`), each root's, as is everything in the kept key folders."""
    for entry in os.scandir(state_dir):
        if entry.name not in LAYOUT and not entry.name.startswith(ATOMIC_LEFTOVERS):
            raise StateDirError(
                f"state dir {state_dir} holds {accounts.show(entry.name)}, which no state dir "
                "holds: is it one? Nothing done; choose a new or empty directory"
            )
        _check_root_entry(state_dir, Path(entry.path))
        if entry.name in KEPT_KEYS and entry.is_dir(follow_symlinks=False):
            for folder, dirs, files in os.walk(entry.path):
                for name in (*dirs, *files):
                    _check_root_entry(state_dir, Path(folder, name))


def _check_root_entry(state_dir: Path, path: Path) -> None:
    uid = os.lstat(path).st_uid
    if uid != 0:
        raise StateDirError(
            f"state dir {state_dir}: {path} is owned by {_owner(uid)}, not root: it may have "
            "been planted. Nothing done; remove it (what it held is not to be trusted)"
        )
