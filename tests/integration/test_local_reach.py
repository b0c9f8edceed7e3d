"""What a user's shell and jobs can reach in local mode: what the chart's NetworkPolicies let
them, enforced in each pod's network namespace (slonk.local.firewall), and nothing else. An
attack first, then the same path to a service the policies allow, so that a refusal is the
firewall's and not a broken probe."""

from __future__ import annotations

import shlex
import subprocess

from slonk.local.cluster import Cluster
from slonk.local.network import BRIDGE_ADDRESS

from ..support.cluster import LocalCluster

DATABASE, SLURMDBD = "slonk-mariadb-0", "slonk-slurmdbd-0"
WORKER = "slonk-cpu-0"
REFUSED = "Connection refused"


def _connect(address: str, port: int) -> str:
    """A shell command opening a TCP connection: prints `open`, or fails with bash's error.
    The timeout only bounds a dropped connection: a refused one fails at once."""
    probe = f"exec 3<>/dev/tcp/{address}/{port} && echo open"
    return f"timeout 5 bash -c {shlex.quote(probe)}"


def _in_a_job(command: str) -> str:
    return f"srun --nodes=1 --nodelist={WORKER} bash -c {shlex.quote(command)} </dev/null"


def test_a_users_job_and_shell_cannot_reach_the_database(healthy: LocalCluster):
    demo = healthy.user("demo")
    for where, wrap in (("the login pod", str), ("a job", _in_a_job)):
        attack = demo.run(wrap(_connect(DATABASE, 3306)))
        assert attack.rc not in (0, 124), f"{where}: {attack.stdout}{attack.stderr}"
        assert REFUSED in attack.stderr, f"{where}: {attack.stderr}"
        # slurmdbd, which the policies let users' commands ask, answers on the same path.
        assert demo.check_output(wrap(_connect(SLURMDBD, 6819))) == "open", where
    demo.check_output("sacct -X -n -o JobID")  # answers (exit 0)
    assert demo.check_output(_in_a_job("sacct -X -n -P -o User -j $SLURM_JOB_ID")) == "demo"


def test_the_login_pod_reaches_neither_the_api_nor_the_exporters(healthy: LocalCluster):
    """Its egress policy: Slurm's daemons, the directory, the workers' sshd; not the API
    server (outside the cluster) nor a worker's metrics port."""
    demo = healthy.user("demo")
    for address, port in ((BRIDGE_ADDRESS, 6443), (WORKER, 9341)):
        attack = demo.run(_connect(address, port))
        assert REFUSED in attack.stderr, f"{address}:{port}: {attack.stdout}{attack.stderr}"
    assert demo.check_output(_connect(WORKER, 6818)) == "open"


def test_the_host_is_outside_the_cluster(healthy: LocalCluster):
    """From the host's side of the bridge (where `slonk local ssh` comes from): the login
    pod's sshd, which anyone may reach; not the database."""
    local = Cluster(healthy.state_dir)
    pods = local.record()["pods"]

    def from_host(pod: str, port: int) -> subprocess.CompletedProcess[str]:
        probe = _connect(pods[pod]["address"], port)
        command = ["ip", "netns", "exec", local.network.switch, "sh", "-c", probe]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    assert REFUSED in from_host(DATABASE, 3306).stderr
    assert from_host("slonk-login-0", 22).stdout.strip() == "open"
