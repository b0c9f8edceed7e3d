"""A local cluster's private network: a bridge in a namespace of its own, a veth per pod.

Nothing touches the host's network. Every name starts with a prefix derived from the state
directory, so two clusters on one machine never collide; the addresses may repeat, since
each cluster's bridge lives in its own namespace.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from slonk.base.errors import SlonkError

NETNS_DIR = Path("/run/netns")
# A /16, so that a cluster may hold more pods than a /24's 240; the first pods keep the
# addresses they had in 10.73.0.0/24 (a cluster made before keeps working).
SUBNET = "10.73"
PREFIX_LEN = 16
BRIDGE_ADDRESS = f"{SUBNET}.0.1"
FIRST_POD_HOST = 10
# A Linux bridge takes at most 1024 ports (BR_MAX_PORTS), one a pod.
MAX_PODS = 1000
CLONE_NEWNET = 0x40000000
PARALLEL_IP = 8  # `ip` processes at once setting up pods' own sides


def _ip(*args: str, batch: Sequence[str] = ()) -> None:
    """One `ip` command, or with `batch` one `ip -batch` running those lines (one process for
    hundreds of commands: `up` of 256 pods would otherwise fork some 1500)."""
    argv = ["ip", *args, *(["-batch", "-"] if batch else [])]
    text = "".join(f"{line}\n" for line in batch)
    result = subprocess.run(argv, input=text, capture_output=True, text=True, check=False)
    if result.returncode:
        raise NetworkError(f"{' '.join(argv)}: {result.stderr.strip() or 'failed'}")


class NetworkError(SlonkError):
    """An `ip` command failed; the message carries what it said."""


def pod_address(index: int) -> str:
    if not 0 <= index < MAX_PODS:
        raise ValueError(f"local mode runs at most {MAX_PODS} pods")
    host = FIRST_POD_HOST + index
    return f"{SUBNET}.{host >> 8}.{host & 0xFF}"


def address_index(address: str) -> int:
    """The index pod_address made `address` from: it also names the pod's bridge port."""
    third, fourth = (int(part) for part in address.split(".")[2:])
    return (third << 8) + fourth - FIRST_POD_HOST


def pod_addresses(names: Iterable[str], kept: Mapping[str, str]) -> dict[str, str]:
    """An address for each pod: one in `kept` keeps its own, since a running pod's address
    never moves (a StatefulSet scaling up leaves its pods alone); the others take the lowest
    free ones, in order."""
    taken = {address_index(a) for a in kept.values()}
    addresses = {}
    free = (i for i in itertools.count() if i not in taken)
    for name in names:
        addresses[name] = kept[name] if name in kept else pod_address(next(free))
    return addresses


def enter_network(netns: Path) -> None:
    """Join a network namespace, this thread and those it starts after (Python 3.11 has no
    os.setns). A socket made before stays in the namespace it was made in: a process serves
    the host's loopback and reaches the cluster's network."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(netns) as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")


def set_sysctls(netns: str, sysctls: Mapping[str, str]) -> None:
    """Set a pod's network sysctls in its namespace, as a runtime does before the pod starts
    (a /proc/sys/net file shows the namespace of the process that opens it)."""
    for name, value in sysctls.items():
        path = Path("/proc/sys", *name.split("."))
        subprocess.run(
            ["nsenter", f"--net={NETNS_DIR / netns}", "--", "tee", str(path)],
            input=f"{value}\n", text=True, stdout=subprocess.DEVNULL, check=True,
        )  # fmt: skip


def is_mount_point(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").open())


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return None


def processes_in(name: str) -> list[int]:
    """Host pids of every process whose network namespace is `name`."""
    return processes_by_netns([name]).get(name, [])


def processes_by_netns(names: Iterable[str]) -> dict[str, list[int]]:
    """Host pids of every process in each of these network namespaces, in one pass over
    /proc (a pass per namespace is 256 passes over thousands of processes at 256 pods)."""
    by_inode = {inode: name for name in names if (inode := netns_inode(name)) is not None}
    found: dict[str, list[int]] = {}
    if not by_inode:
        return found
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                name = by_inode.get(os.stat(entry / "ns" / "net").st_ino)
            except OSError:
                continue  # exited meanwhile, or a kernel thread
            if name is not None:
                found.setdefault(name, []).append(int(entry.name))
    return found


@dataclass(frozen=True)
class Network:
    prefix: str

    @classmethod
    def for_state_dir(cls, state_dir: Path) -> Network:
        digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()
        return cls(prefix=f"slk{digest[:8]}")

    @property
    def switch(self) -> str:
        return f"{self.prefix}-switch"

    def pod_netns(self, pod: str) -> str:
        return f"{self.prefix}-{pod}"

    def namespaces(self) -> list[str]:
        """Every namespace of this cluster, whichever step made it."""
        if not NETNS_DIR.is_dir():
            return []
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{self.prefix}-"))

    def create_switch(self) -> None:
        if netns_inode(self.switch) is not None:
            return
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "addr", "add", f"{BRIDGE_ADDRESS}/{PREFIX_LEN}", "dev", "br0")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add_pod(self, pod: str, address: str) -> None:
        """A namespace for the pod with eth0 (at `address`) on the bridge's port p<index>."""
        self.add_pods({pod: address})

    def add_pods(self, addresses: Mapping[str, str]) -> None:
        """add_pod for each of {pod: address} lacking its namespace: two `ip` batches for
        all of them (the namespaces, the bridge's side), then one per pod (its own side)."""
        new = {p: a for p, a in addresses.items() if netns_inode(self.pod_netns(p)) is None}
        if not new:
            return
        _ip(batch=[f"netns add {self.pod_netns(p)}" for p in new])
        switch_side = []
        for pod, address in new.items():
            port = f"p{address_index(address)}"
            switch_side += [
                f"link add {port} type veth peer name eth0 netns {self.pod_netns(pod)}",
                f"link set {port} master br0 up",
            ]
        _ip("-n", self.switch, batch=switch_side)

        def pod_side(pod: str) -> None:
            _ip("-n", self.pod_netns(pod), batch=[
                "link set lo up",
                f"addr add {new[pod]}/{PREFIX_LEN} dev eth0",
                "link set eth0 up",
            ])  # fmt: skip

        with ThreadPoolExecutor(max_workers=PARALLEL_IP) as pool:
            list(pool.map(pod_side, new))

    def load_firewall(self, tables: Mapping[str, tuple[str, str]]) -> None:
        """Replace the filter tables of each pod's namespace: {pod: (iptables-restore input,
        ip6tables-restore input)} (slonk.local.firewall derives them from the chart's
        NetworkPolicies). Each restore is atomic: a pod never runs half a table."""

        def load(pod: str) -> None:
            for command, table in zip(
                ("iptables-restore", "ip6tables-restore"), tables[pod], strict=True
            ):
                argv = ["ip", "netns", "exec", self.pod_netns(pod), command]
                result = subprocess.run(
                    argv, input=table, capture_output=True, text=True, check=False
                )
                if result.returncode:
                    raise NetworkError(f"{' '.join(argv)}: {result.stderr.strip() or 'failed'}")

        with ThreadPoolExecutor(max_workers=PARALLEL_IP) as pool:
            list(pool.map(load, tables))

    def remove_pod(self, pod: str) -> None:
        """The pod's namespace; its veth pair (and so its bridge port) goes with it."""
        if netns_inode(self.pod_netns(pod)) is not None:
            _ip("netns", "delete", self.pod_netns(pod))

    def destroy(self, made_netns_mount: bool = False) -> None:
        """Delete every namespace of this cluster (their veths go with them). iproute2 makes
        /run/netns a mount point with the machine's first namespace: when that was this
        cluster's doing and no namespace is left, undo it too."""
        if namespaces := self.namespaces():
            _ip(batch=[f"netns delete {netns}" for netns in namespaces])
        if made_netns_mount and is_mount_point(NETNS_DIR) and not any(NETNS_DIR.iterdir()):
            subprocess.run(["umount", str(NETNS_DIR)], check=True)
