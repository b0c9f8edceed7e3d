"""A local pod runs on its image's root filesystem, as on Kubernetes: nothing of the host
(its accounts, configuration, binaries, or the state directory of `slonk local`, which
holds the controller's ServiceAccount token, every Secret, other pods' layers and the
client SSH key) is visible in a pod beyond what the chart mounts, and, from a checkout,
the checkout itself (read-only). The pod's root is not the host's: it holds the capabilities
its container renders, in a user namespace of its own, and cannot remount, unmount or
write what the host lends it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slonk.local.cluster import DEFAULT_STATE_DIR, Cluster, pod_spec
from slonk.local.fake_apiserver import PORT
from slonk.local.manifests import LocalModeError, Mount, Pod
from slonk.local.network import BRIDGE_ADDRESS
from slonk.local.release import render

from ..support.cluster import LocalCluster, image, running

CHECKOUT = Path(__file__).parents[2]


@pytest.mark.parametrize("state_dir", [CHECKOUT, CHECKOUT / ".state"])
def test_a_state_dir_a_pod_would_see_through_the_checkout_is_refused(state_dir: Path):
    pod = Pod(
        "slonk-cpu-0",
        "worker",
        {},
        ("true",),
        {},
        (Mount("claim", "hooks", "/var/lib/slonk/git"),),
        "slonk",
        image=image("worker"),
    )
    with pytest.raises(LocalModeError, match=f"state dir {state_dir} lies in /"):
        pod_spec(Cluster(state_dir), pod, "", "host")
    pod_spec(Cluster(state_dir), pod, "", "podman")  # sees only its volumes: fine


@pytest.fixture(scope="module")
def exposed() -> Iterator[LocalCluster]:
    """A cluster with its state directory under /var, where the default one lies. `up`
    makes it root's alone (0700); pods, root included, do not see it at all."""
    state_dir = Path(tempfile.mkdtemp(prefix="slonk-isolation-", dir="/var/tmp"))
    try:
        with running(state_dir):
            yield LocalCluster(state_dir)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def _token(cluster: LocalCluster) -> str:
    (token,) = (cluster.state_dir / "serviceaccounts").glob("*/token")
    return token.read_text()


def test_a_user_sees_nothing_of_the_state_dir(exposed: LocalCluster):
    user, state = exposed.user("demo"), exposed.state_dir
    for where in (state, DEFAULT_STATE_DIR):
        for listing in (
            user.run(f"ls -A {where}"),  # on the login pod, and in a job
            user.run(f"srun --nodes=1 ls -A {where} </dev/null"),
        ):
            assert listing.stdout == "" and (
                listing.rc == 0 or "No such file or directory" in listing.stderr
            ), listing
    # Nor anywhere a token could otherwise be read: the login pod mounts none.
    found = user.run(f"grep -rlsF {_token(exposed)} /var/lib/slonk /var/run /run /etc /tmp")
    assert found.stdout == ""
    assert user.run(f"cat {state}/ssh/id_ed25519").rc != 0


def test_a_user_cannot_use_the_fake_api(exposed: LocalCluster):
    """From a login pod the policies let nothing reach it; from a job (a worker's egress is
    open) it refuses a guessed token."""
    pod = "slonk-cpu-0"
    pid = Cluster(exposed.state_dir).pid(pod)
    request = (
        "import ssl, urllib.request as r\n"
        f"q = r.Request('https://{BRIDGE_ADDRESS}:{PORT}/api/v1/namespaces/default/pods/{pod}',"
        " method='DELETE', headers={'Authorization': 'Bearer guessed'})\n"
        "try: r.urlopen(q, context=ssl._create_unverified_context(), timeout=10)\n"
        "except r.HTTPError as e: print(e.code)\n"
        "except OSError as e: print(type(e.reason).__name__)\n"
    )
    user = exposed.user("demo")
    assert user.run("python3 -c %s", request).stdout.strip() == "ConnectionRefusedError"
    in_a_job = user.run("srun --nodes=1 --nodelist=%s python3 -c %s </dev/null", pod, request)
    assert in_a_job.stdout.strip() == "401", in_a_job
    assert Cluster(exposed.state_dir).pid(pod) == pid  # not restarted


def test_root_in_a_pod_still_gets_its_mounts_and_not_the_rest(exposed: LocalCluster):
    controller = exposed.pod("slonk-controller-0")
    mounted = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert controller.check_output(f"cat {mounted}") == _token(exposed)
    assert "No such file or directory" in controller.run(f"ls -A {exposed.state_dir}").stderr
    checkout = Path(__file__).parents[2]
    assert "Read-only file system" in controller.run(f"touch {checkout}/slonk-was-here").stderr


def test_a_pod_runs_the_images_userland_not_the_hosts(exposed: LocalCluster):
    worker = exposed.pod("slonk-cpu-0")
    assert worker.check_output("slurmd -V").startswith("slurm-wlm 24.11")
    accounts = dict(
        line.split(":")
        for line in worker.check_output("getent passwd | cut -d: -f1,3").splitlines()
    )
    # A fresh machine's uid 1000 user (and any other of the host's people) is the host's only.
    host = [e.split(":") for e in Path("/etc/passwd").read_text().splitlines()]
    people = {e[0] for e in host if 1000 <= int(e[2]) < 60000}  # Debian: its users
    assert not people & set(accounts), people & set(accounts)
    assert accounts["slurm"] == "401" and accounts["demo"] == "5000"
    # The host's tools are not there (the host builds images with them; no pod needs them).
    for tool in ("buildah", "podman", "debootstrap"):
        assert shutil.which(tool), f"the host should have {tool}"
        assert worker.run(f"command -v {tool}").rc != 0
    release = worker.check_output("grep VERSION_CODENAME /etc/os-release")
    assert release == "VERSION_CODENAME=trixie"


# Capabilities by number (linux/capability.h), to read /proc/PID/status's masks.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE",
    "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME",
    "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ",
    "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip
ROLES = ("slonk-controller-0", "slonk-cpu-0", "slonk-login-0")


def _rendered_security(cluster: LocalCluster, pod: str) -> dict[str, object]:
    """The pod's container's securityContext as the chart renders it for the cluster's values."""
    values = yaml.safe_load(Cluster(cluster.state_dir).values_file.read_text()) or {}
    objects, _ = render(Cluster(cluster.state_dir), values)
    (statefulset,) = [s for s in objects.statefulsets if pod == f"{s['metadata']['name']}-0"]
    security: dict[str, object] = statefulset["spec"]["template"]["spec"]["containers"][0][
        "securityContext"
    ]
    return security


def _status(host, pid: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    lines = host.check_output(f"cat /proc/{pid}/status").splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _names(mask: str) -> set[str]:
    bits = int(mask, 16)
    return {name for n, name in enumerate(CAPABILITIES) if bits >> n & 1}


@pytest.mark.parametrize("name", ROLES)
def test_root_in_a_pod_holds_its_containers_capabilities_and_no_more(
    exposed: LocalCluster, name: str
):
    pod, security = exposed.pod(name), _rendered_security(exposed, name)
    wanted = set(security["capabilities"]["add"])  # type: ignore[index]
    # `slonk local exec` (as kubectl exec) and the pod's own processes (PID 1, s6-svscan:
    # every daemon, hook and job descends from it).
    for pid in ("self", "1"):
        status = _status(pod, pid)
        assert _names(status["CapBnd"]) == wanted, (pid, status["CapBnd"])
        assert _names(status["CapEff"]) == wanted, (pid, status["CapEff"])
        assert status["CapInh"] == status["CapAmb"] == "0000000000000000"
        no_new_privs = security.get("allowPrivilegeEscalation") is False
        assert status["NoNewPrivs"] == str(int(no_new_privs)), pid
    assert _status(pod, "1")["Seccomp"] == "2"  # RuntimeDefault: a filter
    # ... all of them in a user namespace of the pod's own, uids mapped to themselves.
    assert pod.check_output("readlink /proc/self/ns/user") != os.readlink("/proc/self/ns/user")
    assert pod.check_output("cat /proc/self/uid_map").split() == ["0", "0", "4294967295"]


# Each line that prints BREACH is an attack that worked. Mount points come from the pod's
# own mount table: every one of them is the host's (the pod made none of its own).
ATTACKS = r"""
checkout=$1
mounts=$(awk '{print $5}' /proc/self/mountinfo | sort -u)
read_only=$(awk '$6 ~ /(^|,)ro(,|$)/ {print $5}' /proc/self/mountinfo | sort -u)
for m in $read_only; do
    mount -o remount,rw "$m" 2>/dev/null && echo "BREACH remount,rw $m"
    mount -o remount,bind,rw "$m" 2>/dev/null && echo "BREACH remount,bind,rw $m"
done
for m in $mounts; do
    [ "$m" = / ] || { umount -l "$m" 2>/dev/null && echo "BREACH umount $m"; }
done
for f in "$checkout/slonk-was-here" /etc/slonk/slonk-was-here; do
    touch "$f" 2>/dev/null && echo "BREACH wrote $f"
done
# A copy of a read-only mount stays read-only (with SYS_ADMIN, a bind is allowed).
mkdir -p /var/tmp/copy && mount --bind "$checkout" /var/tmp/copy 2>/dev/null && {
    mount -o remount,bind,rw /var/tmp/copy 2>/dev/null && echo "BREACH rw copy"
    touch /var/tmp/copy/slonk-was-here 2>/dev/null && echo "BREACH wrote the copy"
    umount /var/tmp/copy
}
# The kernel's settings and triggers are the machine's: opening them to write is enough.
for f in /proc/sys/kernel/core_pattern /proc/sys/kernel/modprobe /proc/sysrq-trigger; do
    (: > "$f") 2>/dev/null && echo "BREACH opened $f"
done
# A user namespace of its own gives root no more over what the pod was given.
unshare -U -r --mount sh -c "mount -o remount,bind,rw $checkout || exit 1
    touch $checkout/slonk-was-here" 2>/dev/null && echo "BREACH remounted in a nested namespace"
python3 -c '
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
# EPERM; ENOSYS from a kernel built without modules
refused = libc.syscall(313, -1, b"", 0) == -1 and ctypes.get_errno() in (1, 38)
sys.exit(0 if refused else 1)
' || echo "BREACH finit_module (loading a kernel module)"
echo attacks done
"""


@pytest.mark.parametrize("name", ROLES)
def test_root_in_a_pod_cannot_remount_unmount_or_write_the_hosts_files(
    exposed: LocalCluster, name: str
):
    pod, state = exposed.pod(name), Cluster(exposed.state_dir)
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    config = sorted(p.name for p in state.configmap_dir("slonk-cluster").iterdir())
    result = pod.run("sh -c %s attack %s", ATTACKS, str(CHECKOUT))
    assert result.stdout.splitlines() == ["attacks done"], result
    assert not (CHECKOUT / "slonk-was-here").exists()
    assert sorted(p.name for p in state.configmap_dir("slonk-cluster").iterdir()) == config
    assert Path("/proc/sys/kernel/core_pattern").read_text() == core_pattern
    assert exposed.slonk("status").returncode == 0  # the pod still runs
