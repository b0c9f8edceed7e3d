"""A real local cluster for the integration and image tests: slurmctld, slurmd, munged and
sshd under s6 in namespaced pods, started by `slonk local up` and driven through the `slonk`
CLI; the session's cluster fixtures, which the directories' conftests take from here.

Pods are testinfra hosts: a command reaches one as `slonk local exec` would (as root in the
pod) or as `slonk local ssh USER` would (as a user, through the login pod's sshd), its argv
built in the test's process.

Waits follow causes: a state Slurm reports, a new slurmd start time, a line a pod logs past an
offset taken before the cause. A deadline only bounds such a wait, never stands for one.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import testinfra.host
import yaml
from testinfra.backend import base

from slonk.base import paths
from slonk.health import history
from slonk.local.cluster import Cluster
from slonk.local.manifests import LocalModeError
from slonk.local.network import BRIDGE_ADDRESS
from slonk.local.projection import project
from slonk.slurm import slurm_state
from slonk.slurm.slurm_state import NodeState

SLONK = [sys.executable, "-m", "slonk.cli"]
FAKE_GPU = Path(__file__).parents[1] / "fakes" / "fake-gpu"
# slurmd runs the session cluster's interval checks this often. Each run is a Python process
# of about 0.2 s of CPU; every 2 s, the health runs took 19% of a core per idle cluster, half
# of all it burned idle, with three session clusters at once on two cores (measured: the
# integration stage 583 s at 2, 529 s at 5, CPUs 86% and 77% busy; tests waiting on an
# interval run wait about 1.5 s more).
HEALTH_INTERVAL = 5
# A stopping worker pod waits this long for its jobs (workers.drainTimeoutSeconds), then
# requeues them: long enough for a test to see a job finish first, short for those that wait.
DRAIN_TIMEOUT = 20
# The scratch check's directory, where tests mount a small disk on a worker: one the Epilog
# clears (slonk.health.leftovers.SCRATCH_DIRS) beside a job's own /tmp. The pods see the
# checkout at its own path, so a checkout under it would be hidden from that worker (its
# tests/fakes gone: seen with a clone under /var/tmp): tests/integration refuses to start so.
SCRATCH = "/var/tmp"
USER_CA_SECRET = "slonk-test-user-ca"
# The session cluster's mail relay (tests/integration/mailrelay.py, on the bridge's address,
# which each cluster has of its own) and the domain MailDomain gives user names.
MAIL_RELAY = f"{BRIDGE_ADDRESS}:2525"
MAIL_DOMAIN = "slonk.test"

# The session cluster's recycling: as good as off, but for the tests that turn it on.
SESSION_RECYCLE = {"idleSeconds": 3600, "periodSeconds": 1}
VERSION = yaml.safe_load((paths.chart_dir() / "Chart.yaml").read_text())["appVersion"]
ROLES = ("base", "controller", "worker", "login", "database")


def image(role: str) -> str:
    """The image the chart names for a role, as scripts/build-images tags it."""
    return f"localhost/slonk/{role}:{VERSION}"


def image_exists(name: str) -> bool:
    return (
        shutil.which("podman") is not None
        and subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0
    )


# Past `slonk local upgrade`'s own wait for the controller's verdict (slonk.local.upgrade).
SLONK_TIMEOUT = 300.0


def slonk(
    *args: str, check: bool = True, timeout: float = SLONK_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*SLONK, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"slonk {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@contextlib.contextmanager
def running(
    state_dir: Path, *up_args: str, values: Mapping[str, Any] | None = None
) -> Iterator[Path | None]:
    """A local cluster `up` in `state_dir`, brought `down --purge` after, whatever happened.
    `values` are written beside the state dir and given to `up -f`; yields that file."""
    values_file = None
    if values is not None:
        values_file = state_dir.parent / f"{state_dir.name}-values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        up_args = (*up_args, "-f", str(values_file))
    try:
        slonk("local", "up", *up_args, "--state-dir", str(state_dir))
        yield values_file
    finally:
        slonk("local", "down", "--purge", "--state-dir", str(state_dir), check=False)


class _SlonkBackend(base.BaseBackend):
    """testinfra backend running commands in a pod as `slonk local exec` or `ssh` would, the
    argv built here by the same code (slonk.local.state.Cluster): a `slonk` process per
    command cost about half a second of CPU (its imports), and the tests' waits poll."""

    def __init__(self, target: str, state_dir: Path, **kwargs: Any) -> None:
        self.target, self.state_dir = target, state_dir
        super().__init__(target, **kwargs)

    def prefix(self, local: Cluster) -> list[str]:
        raise NotImplementedError

    def run(self, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
        cmd = self.get_command(command, *args)
        try:
            prefix = self.prefix(Cluster(self.state_dir))
        except LocalModeError as err:  # as the CLI answers it: status 1, the error on stderr
            return self.result(1, self.encode(cmd), b"", f"slonk: error: {err}\n")
        out = self.run_local(" ".join(["%s"] * len(prefix)) + " %s", *prefix, cmd)
        out.command = self.encode(cmd)
        return out


class PodBackend(_SlonkBackend):
    NAME = "slonk-pod"

    def prefix(self, local: Cluster) -> list[str]:
        return local.enter(self.target, ["/bin/sh", "-c"])


class UserBackend(_SlonkBackend):
    """As a user, over ssh to the login pod: ssh hands the command to the user's shell."""

    NAME = "slonk-ssh"

    def prefix(self, local: Cluster) -> list[str]:
        return local.ssh(self.target)


def service_pid(host: testinfra.host.Host, service: str) -> int:
    """The pid of a pod's s6 service (0: down). Not found by name: Slurm 24.11's daemons
    re-exec themselves on `scontrol reconfigure`, and are then called slurmd-wlm, etc."""
    return int(host.check_output(f"s6-svstat -o pid /run/slonk/service/{service}"))


# A wait polls at once, then less often the longer it waits: most checks are a command in a
# pod (and often an RPC to slurmctld), and three test processes polling ten times a second
# through waits of tens of seconds spent CPU the clusters they wait on were short of.
FIRST_POLL, LAST_POLL = 0.1, 0.5


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll until `check()` is truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    value = None
    pause = FIRST_POLL
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(pause)
        pause = min(pause * 1.5, LAST_POLL)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {value!r})")


class HooksRepo:
    """The git repository the session cluster's hooks follow (git-sync period: 1 s)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.path), "-c", "user.name=test", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def push(self, files: dict[str, str | None]) -> str:
        """Write (or, for None, delete) files as executables and commit; returns the commit."""
        for name, text in files.items():
            path = self.path / name
            if text is None:
                path.unlink(missing_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o755)
        self.git("add", "--all")
        self.git("commit", "--quiet", "--allow-empty", "--message", ", ".join(files) or "empty")
        return self.git("rev-parse", "HEAD")

    def create(self) -> None:
        self.path.mkdir(parents=True)
        self.git("init", "--quiet")
        (self.path / "README").write_text("Job hooks for the test cluster.\n")
        self.push({})


class LocalCluster:
    def __init__(
        self, state_dir: Path, hooks: HooksRepo | None = None, user_ca: Path | None = None
    ) -> None:
        self.state_dir = state_dir
        self.hooks = hooks
        self.user_ca = user_ca  # the private key of the CA the login pods trust (USER_CA_SECRET)

    def pod(self, name: str) -> testinfra.host.Host:
        return testinfra.host.Host(PodBackend(name, self.state_dir))

    def user(self, name: str = "demo") -> testinfra.host.Host:
        return testinfra.host.Host(UserBackend(name, self.state_dir))

    def slonk(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return slonk("local", *args, "--state-dir", str(self.state_dir), check=check)

    # The pod's log runs on across restarts: a wait reads it past an offset taken before
    # the cause.
    def log(self, pod: str, since: int = 0) -> str:
        """The pod's log from byte offset `since`: a `log_offset` taken before the cause, or
        `container_log_offset` for the current container's alone."""
        return Cluster(self.state_dir).log(pod, since)

    def log_offset(self, pod: str) -> int:
        """Where the pod's log ends now: what it logs from here on lies past it."""
        return Cluster(self.state_dir).log_offset(pod)

    def container_log_offset(self, pod: str) -> int:
        """Where the log of the pod's current container (its last start) begins."""
        return Cluster(self.state_dir).container_log_offset(pod)

    def _kubeconfig(self) -> Path:
        """`slonk local kubeconfig`'s file: the admin rights of the operator at the host."""
        config = self.state_dir.parent / f"{self.state_dir.name}-kubeconfig"
        if not config.exists():
            config.write_text(self.slonk("kubeconfig").stdout)
            config.chmod(0o600)
        return config

    def kube_client(self) -> Any:
        """The official client against the cluster's fake API server, as the operator."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self._kubeconfig()))

    def kubectl(self, *args: str) -> str:
        """Real kubectl against the cluster's fake API server, with `slonk local kubeconfig`'s
        admin rights (the operator's at the host); fails the test on an error."""
        config = self._kubeconfig()
        cache = config.with_name(f"{config.name}-cache")  # not root's ~/.kube
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={config}", f"--cache-dir={cache}", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout

    def node_states(self) -> dict[str, NodeState]:
        """Every node as the controller sees it ({} while it does not answer)."""
        out = self.pod("slonk-controller-0").run(shlex.join(slurm_state.SHOW_NODES))
        if out.rc != 0:
            return {}
        return {n.name: n for n in slurm_state.parse_nodes(out.stdout)}

    def node_history(self) -> list[history.Event]:
        """The controller's node history ([] before its first event); every line an event."""
        out = self.pod("slonk-controller-0").run(f"cat {paths.NODE_HISTORY}")
        read = [history.parse(line) for line in out.stdout.encode().splitlines()]
        assert None not in read, out.stdout
        return [e for e in read if e is not None]

    def nodes(self) -> dict[str, tuple[str, str]]:
        """{node: (state, reason)} as the controller sees it ({} while it does not answer):
        the state as `idle`, `idle+drain`, `mixed`, ... (NodeState.label)."""
        return {name: (n.label, n.reason) for name, n in self.node_states().items()}

    def slurmd_started(self, node: str) -> str:
        """The node's slurmd start time as Slurm has it ("" while unknown): a new value is
        a new slurmd registered."""
        found = self.node_states().get(node)
        return found.slurmd_started if found else ""

    def jobs(self) -> dict[str, str]:
        """{job id: base state} of every job in the queue ({} while it does not answer)."""
        out = self.pod("slonk-controller-0").run(shlex.join(slurm_state.QUEUE))
        return {j.id: j.state for j in slurm_state.parse_jobs(out.stdout)} if out.rc == 0 else {}

    def wait_idle(
        self, nodes: tuple[str, ...] = ("slonk-cpu-0", "slonk-cpu-1"), timeout: float = 60.0
    ) -> None:
        seen: dict[str, tuple[str, str]] = {}

        def idle() -> bool:
            seen.update(self.nodes())
            return all(seen.get(n, ("",))[0] == "idle" for n in nodes)

        try:
            wait_for(f"{', '.join(nodes)} idle", idle, timeout)
        except AssertionError as err:
            raise AssertionError(f"{err}; last seen: {seen}") from None

    def submit(self, *sbatch_args: str, user: str = "demo") -> str:
        out = self.user(user).check_output("sbatch --parsable " + shlex.join(sbatch_args))
        return out.strip()

    def recycle_as_the_session_does(self) -> None:
        """Undo a test's recycle settings. By name: `upgrade` keeps the values in force (as
        `helm upgrade --reuse-values`), so one with no file changes nothing."""
        chart = yaml.safe_load((paths.chart_dir() / "values.yaml").read_text())
        back = {"health": {"recycle": {**chart["health"]["recycle"], **SESSION_RECYCLE}}}
        values = self.state_dir.parent / f"{self.state_dir.name}-recycle-back.yaml"
        values.write_text(yaml.safe_dump(back))
        self.slonk("upgrade", "-f", str(values))

    def start(self, script: str, *sbatch_args: str) -> str:
        """A job of demo's whose script has begun on its node, so its Prolog ran and its
        extern step (what pam_slurm_adopt and the health checks look for) is there: Slurm
        says RUNNING as soon as it allocates the job."""
        began = "touch $HOME/.began-$SLURM_JOB_ID; "
        job = self.submit(*sbatch_args, "--wrap", began + script)
        wait_for(f"job {job} begun", lambda: self.user().run(f"rm .began-{job}").rc == 0)
        return job


C = TypeVar("C", bound=LocalCluster)


def cluster_of_its_own(
    name: str,
    values: Mapping[str, Any] | None,
    make: Callable[[Path], C],
    *up_args: str,
    idle: tuple[str, ...] = (),
) -> Any:
    """A module's own cluster, as a module-scoped fixture: `up` with `values` (and `up_args`)
    in a state dir of its own, `make(state_dir)` yielded once the `idle` nodes are, brought
    down after the module whatever happened."""

    @pytest.fixture(scope="module")
    def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[C]:
        state_dir = tmp_path_factory.mktemp(name) / "state"
        with running(state_dir, *up_args, values=values):
            cluster = make(state_dir)
            if idle:
                cluster.wait_idle(idle)
            yield cluster

    return own


def user_ca(state_dir: Path, directory: Path) -> Path:
    """A CA key for users' certificates, its public half in the Secret USER_CA_SECRET (made
    as a site's would be, before the cluster: local mode keeps a Secret's files in the state
    directory). Returns the private key."""
    key = directory / "user-ca"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test CA", "-f", str(key)],
        check=True,
    )
    secret = {"ca.pub": key.with_suffix(".pub").read_bytes()}
    project(Cluster(state_dir).secret_dir(USER_CA_SECRET), secret, mode=0o400)
    return key


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state_dir = tmp_path_factory.mktemp("local-cluster")
    hooks = HooksRepo(tmp_path_factory.mktemp("hooks") / "repo")
    hooks.create()
    ca = user_ca(state_dir, tmp_path_factory.mktemp("user-ca"))
    values = {
        "workers": {"drainTimeoutSeconds": DRAIN_TIMEOUT},
        "hooks": {"enabled": True, "git": {"repo": f"file://{hooks.path}", "periodSeconds": 1}},
        "health": {
            "intervalSeconds": HEALTH_INTERVAL,
            # Both workers "have" two GPUs: a fake nvidia-smi (tests/fakes) answers for them.
            # Scratch at SCRATCH: tests fill it, and a checkout must stay seen (see there).
            "checks": {
                "gpu": {
                    "expectedCount": 2,
                    "nvidiaSmi": f"{FAKE_GPU} nvidia-smi",
                    "dmesg": f"{FAKE_GPU} dmesg",
                },
                "scratch": {"path": SCRATCH},
            },
            # Recycling is as good as off, but for the tests that turn it on.
            "recycle": SESSION_RECYCLE,
        },
        # A node resumed by hand while its Kubernetes cause holds is drained within a second.
        "syncer": {"slurmPollSeconds": 1},
        # Fair share counts a job's usage within a minute (Slurm's default: 5).
        "slurm": {"slurmConf": {"PriorityCalcPeriod": 1}},
        # SSO-style logins: certificates from this CA log in (tests/integration/test_local_ssh.py).
        "ssh": {"trustedUserCAKeys": USER_CA_SECRET},
        # Slurm's REST API, and with it users' tokens beside munge for every Slurm daemon
        # (tests/integration/test_local_restapi.py).
        "restapi": {"enabled": True},
        # The site's per-user scratch volume at /scratch (tests/integration/test_local_ssh.py).
        "scratch": {"existingClaim": "site-scratch"},
        # Mail through a relay that tests/integration/test_local_mail.py runs.
        "mail": {"relay": MAIL_RELAY, "domain": MAIL_DOMAIN},
    }
    with running(state_dir, values=values):
        yield LocalCluster(state_dir, hooks, ca)


@pytest.fixture
def healthy(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster, idle before the test and made idle again after it, whatever it did."""
    cluster.wait_idle()
    yield cluster
    local = Cluster(cluster.state_dir)
    for name in local.pod_names():
        if local.pid(name) is None:  # a test that stopped a pod and failed before starting it
            cluster.slonk("restart", name)
    wait_for("the controller", lambda: cluster.jobs() is not None and cluster.nodes())
    cluster.pod("slonk-controller-0").run("scancel --user=demo")
    cluster.wait_idle()
