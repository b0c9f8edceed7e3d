"""A local pod runs on its image's root filesystem, as on Kubernetes: nothing of the host
(its accounts, configuration, binaries, or the state directory of `slonk local`, which
holds the controller's ServiceAccount token, every Secret, other pods' layers and the
client SSH key) is visible in a pod beyond what the chart mounts, and, from a checkout,
the checkout itself (read-only).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slonk.local.cluster import DEFAULT_STATE_DIR, Cluster, pod_spec
from slonk.local.fake_apiserver import PORT
from slonk.local.manifests import LocalModeError, Mount, Pod
from slonk.local.network import BRIDGE_ADDRESS

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
    pod = "slonk-cpu-0"
    pid = Cluster(exposed.state_dir).pid(pod)
    request = (
        "import ssl, urllib.request as r\n"
        f"q = r.Request('https://{BRIDGE_ADDRESS}:{PORT}/api/v1/namespaces/default/pods/{pod}',"
        " method='DELETE', headers={'Authorization': 'Bearer guessed'})\n"
        "try: r.urlopen(q, context=ssl._create_unverified_context(), timeout=10)\n"
        "except r.HTTPError as e: print(e.code)\n"
    )
    answer = exposed.user("demo").run("python3 -c %s", request)
    assert answer.stdout.strip() == "401", answer
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
