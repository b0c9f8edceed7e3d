"""No user holds more than a share of srun's ports on a pod (issue 28).

srun and salloc listen on slurm.conf's SrunPortRange, pinned so that the NetworkPolicies let
exactly those ports in. Any process may bind them: one user holding all of them (one process
was enough) made every other user's srun on that pod fail with "Address already in use". No
kernel limit counts a user's bound ports short of a cgroup BPF program, and a socket bound but
neither listening nor connected appears in no /proc/net table. The kernel's socket
diagnostics (sock_diag, Linux 6.5 or later for such sockets) do show every TCP socket of the
pod's network namespace with its owner's uid. So the login and worker agents try to bind a
sample of the range every PERIOD_SECONDS, as srun would; when most of the sample is taken,
the range runs short, and a user holding more than a tenth of it (as a user may hold a tenth
of the job table) loses every process they run on the pod, and the log says who and why.
The sample costs a few socket calls; a full dump walks the kernel's socket tables, which all
network namespaces share (about 5 ms on this project's test machine), so it waits for need.

Every process, not only the holders: which process holds a socket shows only in
/proc/PID/fd, which a process can close to its own user (PR_SET_DUMPABLE), and root reads
another user's only with CAP_SYS_PTRACE; root reaches them all by uid
(slonk.health.user_processes). A tenth is 100 sruns at once with the default range (srun takes 3
ports, and 2 more per 48 nodes). Others' sruns can fail until the next look: this contains a
user, it does not forbid the bind (only a cgroup BPF program could, per user). Root's sockets
and system accounts' (the pod's daemons) are never counted."""

from __future__ import annotations

import os
import random
import socket
import struct
import sys
import threading
from collections.abc import Iterator

from slonk.health.user_processes import SYSTEM_UID_MAX, end_processes, running_users

PERIOD_SECONDS = 1.0
SAMPLE = 16  # ports tried each period
SHORT = 12  # of them taken: the range runs short
SHARE = 10  # a user may hold 1/SHARE of the range
SRUN_PORTS = 3  # what one srun takes: a share is never less
# sock_diag (linux/sock_diag.h, linux/inet_diag.h)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_ALL_STATES = 0xFFFFFFFF  # with TCPF_BOUND_INACTIVE: sockets bound and nothing more
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2, the socket id left empty: all
_PORT = struct.Struct("!H")  # inet_diag_msg's id.idiag_sport, at offset 4
_OWNER = struct.Struct("=I")  # inet_diag_msg's idiag_uid, at offset 64


def share(first: int, last: int) -> int:
    return max(SRUN_PORTS, (last - first + 1) // SHARE)


def running_short(first: int, last: int) -> bool:
    """Whether SHORT of SAMPLE ports of first..last, picked at random, cannot be bound as
    srun binds them (SO_REUSEADDR). Tried dual-stack where the pod has IPv6: such a bind
    meets a holder of either family."""
    ports = random.sample(range(first, last + 1), min(SAMPLE, last - first + 1))
    tried = taken = 0
    for port in ports:
        try:
            probe = _probe_socket()
        except OSError:
            continue  # no descriptor this moment: no evidence either way
        with probe:
            tried += 1
            try:
                probe.bind(("::" if probe.family == socket.AF_INET6 else "0.0.0.0", port))
            except OSError:
                taken += 1
    return tried > 0 and taken * SAMPLE >= SHORT * tried


def _probe_socket() -> socket.socket:
    """A socket that binds a port as srun's would: both families where the pod has IPv6."""
    try:
        probe = _set(socket.socket(socket.AF_INET6), socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    except OSError:
        probe = socket.socket(socket.AF_INET)  # a pod without IPv6
    return _set(probe, socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def _set(sock: socket.socket, level: int, option: int, value: int) -> socket.socket:
    """`sock` with the option set; closed, not leaked, when it cannot be."""
    try:
        sock.setsockopt(level, option, value)
    except OSError:
        sock.close()
        raise
    return sock


def sees_bound_only() -> bool:
    """Whether this kernel's sock_diag shows a socket bound and nothing more (Linux 6.5 and
    later): without it, a user holding ports that way is not found."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        return any(p == port for p, _uid in tcp_sockets())


def tcp_sockets() -> Iterator[tuple[int, int]]:
    """Every TCP socket of this network namespace, IPv4 and IPv6, in any state: (local port,
    owner's uid)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES)
        header = _HEADER.pack(
            _HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
        )
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as diag:
            diag.send(header + request)
            yield from _replies(diag)


def _replies(diag: socket.socket) -> Iterator[tuple[int, int]]:
    while True:
        data, offset = diag.recv(1 << 16), 0
        while offset + _HEADER.size <= len(data):
            length, kind = _HEADER.unpack_from(data, offset)[:2]
            body, end = offset + _HEADER.size, offset + length
            if length < _HEADER.size or end > len(data):
                raise OSError(f"sock_diag: a reply of {length} bytes in {len(data)}")
            if kind in (_NLMSG_DONE, _NLMSG_ERROR):
                code = -struct.unpack_from("=i", data, body)[0] if end >= body + 4 else 0
                if code:  # an error, or a dump the kernel could not finish
                    raise OSError(code, f"sock_diag: {os.strerror(code)}")
                return
            if kind == _SOCK_DIAG_BY_FAMILY and end >= body + 68:
                (port,) = _PORT.unpack_from(data, body + 4)
                (uid,) = _OWNER.unpack_from(data, body + 64)
                yield port, uid
            offset += (length + 3) & ~3


def holders(first: int, last: int) -> dict[int, set[int]]:
    """The ports of first..last each user holds (not root's or a system account's: the
    pod's daemons). Ports, not sockets: every connection an srun accepts shares its port."""
    held: dict[int, set[int]] = {}
    for port, uid in tcp_sockets():
        if first <= port <= last and uid > SYSTEM_UID_MAX:
            held.setdefault(uid, set()).add(port)
    return held


def look(first: int, last: int) -> list[str]:
    """One look: what was done to users over their share, in log lines."""
    said = []
    most = share(first, last)
    for uid, ports in holders(first, last).items():
        if len(ports) <= most or not running_users() - {uid}:
            continue  # alone on the pod, a user's sruns keep no one else out
        held = (
            f"uid {uid} held {len(ports)} of srun's ports {first}-{last} (a user's share: {most})"
        )
        try:
            ended, still = end_processes(uid)
            said.append(
                f"{held}: ended its {ended} processes on the pod"
                + (f", {still} still there" if still else "")
            )
        except OSError as err:
            said.append(f"{held}: could not end its processes: {err}")
    return said


def run_forever(ports: tuple[int, int], stop: threading.Event) -> None:
    """The agent's task `srun-ports`: every PERIOD_SECONDS until `stop`, a look whenever the
    range runs short; a range short with no one to blame is said once, as it begins."""
    if not sees_bound_only():
        say(
            "this kernel's sock_diag does not show sockets bound and nothing more (Linux 6.5 "
            "and later do): a user holding srun's ports that way is not found"
        )
    unexplained = False
    while not stop.wait(PERIOD_SECONDS):
        done = look(*ports) if running_short(*ports) else None
        for line in done or ():
            say(line)
        if done == [] and not unexplained:
            say(
                f"srun's ports {ports[0]}-{ports[1]} run short and no user over a share holds "
                "them (connections in TIME_WAIT, which slurm.capTimeWait caps, or a user alone "
                "on the pod): sruns here may fail"
            )
        unexplained = done == []


def say(line: str) -> None:
    print(f"slonk srun-ports: {line}", file=sys.stderr, flush=True)
