"""Living on the login node of a local cluster: ssh to the node of one's job (pam_slurm_adopt
lets the user in, into the job, and keeps everyone else out), SSO-style certificates from the
site's CA, an Open MPI program built on the login node run with plain `srun`, and the tools
researchers use every day.

What "adopted" means here: the session cluster runs slurm.confinement none
(proctrack/linuxproc). pam_slurm_adopt still finds the user's job on the node, hands the
session's sshd process to the job's extern step (slurmstepd accepts it: the module logs
"Process N adopted into job J", and puts SLURM_JOB_ID into the session), and refuses the user
without a job. But linuxproc tracks only a step's own descendants: the session is neither in
`scontrol listpids` nor killed with the job. With confinement cgroup the extern step moves it
into the job's cgroup, where both hold. The tests check what holds in both.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra.host
import yaml

from slonk.local.cluster import Cluster
from slonk.local.projection import project
from slonk.pod.srun_ports import SAMPLE

from ..support.cluster import LocalCluster, slonk, wait_for
from ..support.users import bystander

SSH = "ssh -o BatchMode=yes"
REFUSED = "Access denied by pam_slurm_adopt: you have no active jobs on this node"
# More refusals from one address than OpenSSH 10's default penalties let pass.
ATTEMPTS = 12
# The session's ancestors, up to the pod's first process: pam_slurm_adopt adopts sshd's
# privileged process, and the session's processes descend from it.
ANCESTORS = (
    'p=$$; while [ "$p" -gt 1 ]; do echo "ancestor $p"; '
    "p=$(awk '/^PPid:/ {print $2}' /proc/$p/status); done"
)


@pytest.fixture
def demo(healthy: LocalCluster) -> testinfra.host.Host:
    """demo, having logged in once (an interactive login shell): that made their own key for
    ssh between the pods (rootfs' profile.d/slonk-ssh-key.sh) on the shared /home."""
    user = healthy.user("demo")
    user.check_output("bash -ilc true")
    assert user.file("/home/demo/.ssh/id_ed25519").exists
    return user


def _running(cluster: LocalCluster, *sbatch_args: str) -> str:
    return cluster.start("sleep 600", "--output=/dev/null", *sbatch_args)


def _adopted(cluster: LocalCluster, node: str, since: int, job: str) -> set[int]:
    """The processes pam_slurm_adopt says it adopted into `job` (the node's syslog service
    puts PAM's messages in the pod's log)."""
    found = re.findall(r"pam_slurm_adopt\[\d+\]: Process (\d+) adopted into job (\d+)",
                       cluster.log(node, since))  # fmt: skip
    return {int(pid) for pid, into in found if into == job}


def test_ssh_to_a_node_only_with_a_job_there_and_into_it(healthy, demo):
    since = healthy.log_offset("slonk-cpu-0")
    refused = demo.run(f"{SSH} slonk-cpu-0 hostname")
    assert refused.rc == 255 and REFUSED in refused.stderr, refused.stderr
    wait_for(
        "sshd's refusal in the worker's log",
        lambda: (
            "Access denied for user demo by PAM account configuration"
            in healthy.log("slonk-cpu-0", since)
        ),
    )
    job = _running(healthy, "--nodelist=slonk-cpu-0")
    since = healthy.log_offset("slonk-cpu-0")
    session = demo.check_output(
        f"{SSH} slonk-cpu-0 {shlex.quote(f'hostname; echo job=$SLURM_JOB_ID; {ANCESTORS}')}"
    )
    assert session.splitlines()[:2] == ["slonk-cpu-0", f"job={job}"]
    ancestors = {int(line.split()[1]) for line in session.splitlines()[2:]}
    adopted = wait_for(
        "pam_slurm_adopt's adoption in the worker's log",
        lambda: _adopted(healthy, "slonk-cpu-0", since, job),
    )
    assert adopted & ancestors, (adopted, ancestors)
    # The extern step it joined: with confinement cgroup the session's processes are listed
    # with it; with none (proctrack/linuxproc) only the step's own.
    # Its own steps only: another job's step ending meanwhile leaves a socket that refuses.
    steps = healthy.pod("slonk-cpu-0").check_output(f"scontrol listpids {job}")
    assert re.search(rf"^\S+\s+{job}\s+extern\s", steps, re.M), steps
    # A job on one node opens no other.
    other = demo.run(f"{SSH} slonk-cpu-1 hostname")
    assert other.rc == 255 and REFUSED in other.stderr, other.stderr


def test_one_users_refusals_lock_no_one_else_out(healthy, demo):
    """Every ssh to a worker comes from the login pod's address: another user's refused
    attempts (no job on the node) must not get that address blocked for demo."""
    intruder = healthy.user(bystander(healthy))
    intruder.check_output("bash -ilc true")  # their key for ssh between the pods
    attempts = f"for i in $(seq {ATTEMPTS}); do {SSH} slonk-cpu-0 true; done 2>&1"
    said = intruder.run(attempts).stdout
    assert said.count(REFUSED) == ATTEMPTS, said
    job = _running(healthy, "--nodelist=slonk-cpu-0")
    session = demo.run(f"{SSH} slonk-cpu-0 'echo job=$SLURM_JOB_ID'")
    assert (session.rc, session.stdout.strip()) == (0, f"job={job}"), session.stderr


# One process binding every port of srun's range it can (sockets bound and nothing more:
# no /proc/net table shows them), then holding them.
HOLD_PORTS = """
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
held = []
for port in range(int(sys.argv[1]), int(sys.argv[2]) + 1):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        held.append(s)
    except OSError:
        s.close()
time.sleep(3600)
"""


def test_one_user_holding_sruns_ports_loses_them_and_others_srun(healthy, demo):
    """Another user binds srun's whole range on the login pod (one process did it, and every
    other user's srun failed) while demo is logged in there: the pod's agent ends their
    processes within its look, saying who and how many ports, and demo's srun runs."""
    name = bystander(healthy)
    login = healthy.pod("slonk-login-0")
    first, last = _srun_ports(login)
    # The kernel never hands out a port of the range (the pod's sysctl, set by local mode).
    reserved = login.check_output("cat /proc/sys/net/ipv4/ip_local_reserved_ports").strip()
    assert reserved == f"{first}-{last}"
    uid = login.check_output(f"id -u {name}").strip()
    since = healthy.log_offset("slonk-login-0")
    holder = f"python3 -c {shlex.quote(HOLD_PORTS)} {first} {last}"
    demo.check_output("setsid -f sleep 1801 </dev/null >/dev/null 2>&1")  # demo's session
    try:
        healthy.user(name).check_output(f"setsid -f {holder} </dev/null >/dev/null 2>&1")
        said = wait_for(
            "the login pod's agent to end the holder",
            lambda: re.search(
                rf"slonk srun-ports: uid {uid} held (\d+) of srun's ports {first}-{last} "
                r"\(a user's share: (\d+)\): ended its [1-9]\d* processes on the pod",
                healthy.log("slonk-login-0", since),
            ),
        )
        assert int(said[1]) > int(said[2]) == (last - first + 1) // 10
        assert login.run(f"pgrep -u {name}").rc == 1
        assert demo.check_output("srun -N1 hostname").strip() in ("slonk-cpu-0", "slonk-cpu-1")
    finally:
        login.run(f"pkill -KILL -u {name}; pkill -u demo -x -f 'sleep 1801'")


def _srun_ports(login: testinfra.host.Host) -> tuple[int, int]:
    pinned = login.check_output("scontrol show config | awk '/^SrunPortRange/ {print $3}'")
    first, last = (int(port) for port in pinned.split("-"))
    return first, last


# A connection from every port of srun's range, each closed first from that end, so that the
# kernel keeps the port in TIME_WAIT for a minute, owned by no one; then how many ports of the
# range still bind as srun binds them (SO_REUSEADDR).
CLOSE_FROM_PORTS = """
import socket, sys
first, last = int(sys.argv[1]), int(sys.argv[2])
server = socket.create_server(("127.0.0.1", 0), backlog=64)
for port in range(first, last + 1):
    client = socket.socket()
    try:
        client.bind(("127.0.0.1", port))
        client.connect(server.getsockname())
    except OSError:
        client.close()
        continue
    accepted, _ = server.accept()
    client.close()
    accepted.close()
free = 0
for port in range(first, last + 1):
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
            free += 1
        except OSError:
            pass
print(free)
"""


def test_connections_closed_from_sruns_ports_hold_at_most_half_of_them(healthy, demo):
    """Another user connects from every port of srun's range and closes first: each port
    would wait a minute in TIME_WAIT with no owner to blame, and every srun on the pod failed
    (README, "srun's ports"). The pod caps its TIME_WAIT sockets at half the range
    (slurm.capTimeWait, on in local mode): half the range still binds, and demo's srun runs."""
    login = healthy.pod("slonk-login-0")
    first, last = _srun_ports(login)
    size = last - first + 1
    cap = login.check_output("cat /proc/sys/net/ipv4/tcp_max_tw_buckets").strip()
    assert cap == str(size // 2)
    attacker = healthy.user(bystander(healthy))
    free = attacker.check_output(f"python3 -c {shlex.quote(CLOSE_FROM_PORTS)} {first} {last}")
    # (The pod's agent binds up to SAMPLE ports of the range for a moment each second.)
    assert int(free) >= size // 2 - SAMPLE, f"{free.strip()} of {size} ports free"
    assert demo.check_output("srun -N1 hostname").strip() in ("slonk-cpu-0", "slonk-cpu-1")


def test_a_job_reaches_its_other_node_by_ssh(healthy, demo):
    """From inside a job (a step on one node) to the job's other node, where the user runs
    another job too: pam_slurm_adopt there asks the slurmd the connection comes from which
    job it belongs to, and adopts the session into that one."""
    out = "/home/demo/ssh-from-job.out"
    demo.run(f"rm -f {out}")
    other = _running(healthy, "--nodelist=slonk-cpu-0")
    since = healthy.log_offset("slonk-cpu-0")
    inner = shlex.quote(f"{SSH} slonk-cpu-0 'echo $(hostname) job=$SLURM_JOB_ID'")
    job = healthy.submit(
        "--nodes=2", f"--output={out}", "--wrap",
        f"srun --nodes=1 --ntasks=1 --nodelist=slonk-cpu-1 bash -c {inner}",
    )  # fmt: skip
    wait_for(f"job {job} to finish", lambda: job not in healthy.jobs())
    said = demo.file(out).content_string
    assert said.splitlines() == [f"slonk-cpu-0 job={job}"], healthy.log("slonk-cpu-0", since)
    assert _adopted(healthy, "slonk-cpu-0", since, job)
    assert not _adopted(healthy, "slonk-cpu-0", since, other)
    assert re.search(rf"as demo: member of job {job}$", healthy.log("slonk-cpu-0", since), re.M)


def _ssh_with_certificate(
    cluster: LocalCluster, user: str, key: Path
) -> subprocess.CompletedProcess[str]:
    """ssh to the login pod as `user` with `key` and its certificate (key-cert.pub) alone:
    not the local client key (IdentitiesOnly), no agent."""
    argv = Cluster(cluster.state_dir).ssh(user, ["id", "-un"])
    at = argv.index("-i")
    argv[at : at + 2] = ["-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _certificate(tmp_path: Path, ca: Path, principals: str) -> Path:
    key = tmp_path / f"key-{principals.replace(',', '-')}-{ca.name}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca), "-I", "test", "-n", principals, "-V", "+1h",
         str(key.with_suffix(".pub"))],
        check=True,
    )  # fmt: skip
    return key


@pytest.fixture
def other_ca(tmp_path: Path) -> Iterator[Path]:
    key = tmp_path / "other-ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    yield key


def test_certificates_of_the_configured_ca_log_in(healthy, tmp_path, other_ca):
    assert healthy.user_ca is not None
    signed = _certificate(tmp_path, healthy.user_ca, "demo")
    done = _ssh_with_certificate(healthy, "demo", signed)
    assert (done.returncode, done.stdout) == (0, "demo\n"), done.stderr
    since = healthy.log_offset("slonk-login-0")
    # Another CA's, a certificate naming someone else, and root's (whatever it names).
    for user, key in (
        ("demo", _certificate(tmp_path, other_ca, "demo")),
        ("demo", _certificate(tmp_path, healthy.user_ca, "alice")),
        ("root", _certificate(tmp_path, healthy.user_ca, "root,demo")),
    ):
        refused = _ssh_with_certificate(healthy, user, key)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, (user, key)
    wait_for(
        "sshd's reasons in the login pod's log",
        lambda: (
            "Certificate invalid: name is not a listed principal"
            in (log := healthy.log("slonk-login-0", since))
            and "ROOT LOGIN REFUSED" in log
        ),
    )


HELLO = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size;
    char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    printf("rank %d of %d on %s\n", rank, size, host);
    MPI_Finalize();
    return 0;
}
"""


def test_an_mpi_program_built_on_the_login_node_runs_with_plain_srun(healthy):
    """MpiDefault=pmix: Open MPI's ranks find each other through Slurm's PMIx, no --mpi."""
    demo = healthy.user("demo")
    demo.check_output(f"mkdir -p ~/mpi && printf %s {shlex.quote(HELLO)} > ~/mpi/hello.c")
    demo.check_output("cd ~/mpi && mpicc -o hello hello.c")
    out = demo.check_output("cd ~/mpi && timeout 120 srun --nodes=2 --ntasks=2 ./hello")
    assert sorted(out.splitlines()) == ["rank 0 of 2 on slonk-cpu-0", "rank 1 of 2 on slonk-cpu-1"]


TOOLS = {
    "git": "git --version",
    "vim": "vim --version",
    "nano": "nano --version",
    "less": "less --version",
    "tmux": "tmux -V",
    "screen": "screen --version",
    "rsync": "rsync --version",
    "curl": "curl --version",
    "gcc": "gcc --version",
    "mpicc": "mpicc --version",
    "gdb": "gdb --version",
    "strace": "strace -V",
    "cmake": "cmake --version",
    "jq": "echo '{\"a\": 1}' | jq .a",
    "bc": "echo 6*7 | bc",
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_login_node_has_the_daily_tools(healthy, tool):
    result = healthy.user("demo").run(TOOLS[tool])
    assert result.rc == 0 and result.stdout.strip(), (tool, result.stderr)


SLURM_VERSION_C = r"""
#include <stdio.h>
#include <slurm/slurm.h>
int main(void) {
    long v = SLURM_VERSION_NUMBER;
    if (slurm_api_version() <= 0) return 1; /* linked with libslurm */
    printf("%ld.%02ld\n", SLURM_VERSION_MAJOR(v), SLURM_VERSION_MINOR(v));
    return 0;
}
"""


def test_a_program_builds_against_slurms_library_on_the_login_node(healthy):
    """Slurm's development files (what pyslurm builds against): a program linked with
    libslurm reports the installed release, which the cluster runs too."""
    demo = healthy.user("demo")
    demo.check_output(
        f"mkdir -p ~/slurmdev && printf %s {shlex.quote(SLURM_VERSION_C)} > ~/slurmdev/v.c"
    )
    demo.check_output("cd ~/slurmdev && gcc -o v v.c -lslurm")
    built = demo.check_output("~/slurmdev/v").strip()
    assert demo.check_output("sinfo -V").split()[1].startswith(built)


@pytest.mark.parametrize("tool", ["rsync --version", "git --version"])
def test_jobs_have_rsync_and_git(healthy, tool):
    assert healthy.user("demo").check_output(f"srun -N1 {tool}").strip()


def test_a_venv_in_ones_home(healthy):
    demo = healthy.user("demo")
    demo.check_output("rm -rf ~/venv-test && python3 -m venv ~/venv-test")
    assert demo.check_output("~/venv-test/bin/python -c 'import sys; print(sys.prefix)'") == (
        "/home/demo/venv-test"
    )


@pytest.fixture
def site_module(healthy: LocalCluster) -> Iterator[str]:
    """A tool a site adds: a modulefile on the shared /home/modulefiles (made as root)."""
    login = healthy.pod("slonk-login-0")
    login.check_output(
        "mkdir -p /home/modulefiles/slonk-test && printf '%s\\n' '#%Module' "
        "'setenv SLONK_TEST_TOOL ready' > /home/modulefiles/slonk-test/1.0"
    )
    yield "slonk-test/1.0"
    login.check_output("rm -rf /home/modulefiles/slonk-test")


def test_environment_modules_offer_the_sites_modulefiles(healthy, site_module):
    demo = healthy.user("demo")
    listed = demo.check_output("bash -lc 'module avail --terse 2>&1'")
    assert "/home/modulefiles:" in listed and site_module in listed
    loaded = demo.check_output(f"bash -lc 'module load {site_module} && echo $SLONK_TEST_TOOL'")
    assert loaded == "ready"


def test_jobs_on_the_workers_load_the_sites_modulefiles(healthy, site_module):
    """A bash batch script inherits the `module` function of the login shell it was submitted
    from and runs it on its worker; a login-shell script (`#!/bin/bash -l`) starts its own,
    from the worker's environment modules; srun's tasks inherit it too. (`--wrap` runs
    /bin/sh, which takes no shell function.)"""
    demo = healthy.user("demo")
    show = f"module load {site_module} && echo $SLONK_TEST_TOOL on $(hostname)"
    jobs = []
    for shell in ("#!/bin/bash", "#!/bin/bash -l"):
        demo.check_output(f"printf '%s\\n' {shlex.quote(shell)} {shlex.quote(show)} > modules.sh")
        submit = "sbatch --parsable --output=modules-%j.out modules.sh"
        jobs.append(demo.check_output(f"bash -lc {shlex.quote(submit)}"))
    for job in jobs:
        wait_for(f"job {job} to finish", lambda j=job: j not in healthy.jobs())
        said = demo.check_output(f"cat modules-{job}.out")
        assert re.fullmatch(r"ready on slonk-cpu-\d", said), said
    stepped = demo.check_output(f"bash -lc {shlex.quote(f'srun bash -c {shlex.quote(show)}')}")
    assert re.fullmatch(r"ready on slonk-cpu-\d", stepped), stepped
    demo.check_output(f"rm -f modules.sh {' '.join(f'modules-{j}.out' for j in jobs)}")


def test_each_user_has_scratch_of_their_own_on_login_and_workers(healthy):
    """values scratch: /scratch/<user> is its user's alone, the same volume on the login pod
    and in a job on a worker; another user can neither read it nor make one in its place."""
    other = bystander(healthy)
    demo = healthy.user("demo")
    for pod in ("slonk-login-0", "slonk-cpu-0", "slonk-cpu-1"):
        listed = healthy.pod(pod).check_output(
            f"stat -c '%U %a' /scratch /scratch/demo /scratch/{other}"
        )
        assert listed.splitlines() == ["root 755", "demo 700", f"{other} 700"], pod
    job = healthy.submit("--output=/dev/null", "--wrap", "hostname > /scratch/demo/from-job")
    wait_for(f"job {job} to finish", lambda: job not in healthy.jobs())
    assert demo.check_output("cat /scratch/demo/from-job").startswith("slonk-cpu-")
    stranger = healthy.user(other)
    assert stranger.run("cat /scratch/demo/from-job").rc != 0
    assert stranger.run("mkdir /scratch/carol").rc != 0  # the root is root's
    demo.check_output("rm /scratch/demo/from-job")


def test_a_hostile_ca_file_stops_the_pod_naming_the_line(tmp_path: Path):
    """An option smuggled into the CA Secret (here: a forced command) never reaches sshd: the
    login pod stops at start, and `up` says which line."""
    state_dir = tmp_path / "hostile-ca"
    key = _blob_key(tmp_path)
    project(
        Cluster(state_dir).secret_dir("hostile-ca"),
        {"ca.pub": f'command="/bin/sh" {key}\n'.encode()},
        mode=0o400,
    )
    values = {
        "nodepools": {"cpu": {"replicas": 1, "cpus": 1, "memoryMiB": 256}},
        "workers": {"ssh": {"enabled": False}},
        "ssh": {"trustedUserCAKeys": "hostile-ca"},
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    try:
        up = slonk("local", "up", "-f", str(values_file), "--state-dir", str(state_dir),
                   check=False)  # fmt: skip
        assert up.returncode == 1
        assert "ca.pub (ssh.trustedUserCAKeys, key ca.pub) line 1: starts with 'command=" in (
            up.stderr
        ), up.stderr
    finally:
        slonk("local", "down", "--purge", "--state-dir", str(state_dir), check=False)


def _blob_key(tmp_path: Path) -> str:
    key = tmp_path / "some-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])
