"""Local mode's state directory (the controller's ServiceAccount token, every Secret, other
pods' layers, the client SSH key) is not visible in a pod, beyond what the chart mounts.

First the pod's mount layout alone (slonk.local.podinit in a private mount namespace, no
cluster); then, from the attacker's side, a user on a cluster whose state directory sits
under /var, where the default one does and every pod sees the host's /var.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slonk.local.cluster import DEFAULT_STATE_DIR, Cluster, pod_spec
from slonk.local.fake_apiserver import PORT
from slonk.local.manifests import LocalModeError, Mount, Pod
from slonk.local.network import BRIDGE_ADDRESS

from .conftest import LocalCluster, running


def _podinit(tmp_path: Path, binds: list[dict], hide: list[str], script: str) -> str:
    """Lay out a pod's mounts as podinit does, in a throw-away mount namespace, and run
    `script` there; its output."""
    spec = {
        "hostname": "isolation", "overlays": [], "tmpfs": {}, "binds": binds, "hide": hide,
        "files": {}, "env": {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        "command": ["/bin/sh", "-c", script],
    }  # fmt: skip
    (tmp_path / "pod.json").write_text(json.dumps(spec))
    result = subprocess.run(
        ["unshare", "--mount", "--uts", "--propagation", "private", "--",
         sys.executable, "-m", "slonk.local.podinit", str(tmp_path / "pod.json")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_state_dir_under_the_checkout_is_hidden_and_its_volumes_still_mount(tmp_path: Path):
    checkout = tmp_path / "checkout"
    state = checkout / ".state"
    (state / "serviceaccounts" / "controller").mkdir(parents=True)
    (state / "serviceaccounts" / "controller" / "token").write_text("secret-token")
    (state / "volumes" / "home").mkdir(parents=True)
    (state / "volumes" / "home" / "file").write_text("home file")
    binds = [
        {"source": str(checkout), "target": str(checkout), "readOnly": True},
        {"source": str(state / "volumes" / "home"), "target": str(tmp_path / "home"),
         "readOnly": False},
        # A chart path under a hidden one: made in the hiding tmpfs, before it turns read-only.
        {"source": str(state / "serviceaccounts" / "controller"),
         "target": str(state / "mounted"), "readOnly": True},
    ]  # fmt: skip
    out = _podinit(tmp_path, binds, [str(state), str(tmp_path / "absent")], f"""
        echo "listing: $(ls -A {state})"
        echo "mounted: $(cat {state}/mounted/token)"
        echo "home: $(cat {tmp_path}/home/file)"
        echo written > {tmp_path}/home/new && echo "home writable"
        touch {state}/x 2>/dev/null || echo "hidden read-only"
        touch {checkout}/x 2>/dev/null || echo "checkout read-only"
        cat {state}/serviceaccounts/controller/token 2>/dev/null || echo "token unreadable"
    """)
    assert out.splitlines() == [
        "listing: mounted", "mounted: secret-token", "home: home file", "home writable",
        "hidden read-only", "checkout read-only", "token unreadable",
    ]  # fmt: skip
    assert (state / "volumes" / "home" / "new").read_text() == "written\n"
    assert not (checkout / "x").exists() and not (tmp_path / "absent").exists()


@pytest.mark.parametrize("state_dir", ["/var/lib/slonk", "/var", "/"])
def test_a_state_dir_holding_what_pods_use_is_refused(state_dir: str):
    """Hidden in the pod, it would hide them too (here /var/lib/slonk/git, the hooks' state)."""
    pod = Pod("slonk-cpu-0", "worker", {}, ("true",), {},
              (Mount("claim", "hooks", "/var/lib/slonk/git"),), "slonk")
    with pytest.raises(LocalModeError, match=f"state dir {state_dir} holds /"):
        pod_spec(Cluster(Path(state_dir)), pod, "", "host")
    pod_spec(Cluster(Path(state_dir)), pod, "", "podman")  # sees only its volumes: fine


@pytest.fixture(scope="module")
def exposed() -> Iterator[LocalCluster]:
    """A cluster with its state directory under /var: without hiding, every pod would show
    it through the /var overlay's lower layer (the host's /var), as the default's. `up` also
    makes it root's alone (0700); the hiding keeps it from the pods' root too."""
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
        for listing in (user.run(f"ls -A {where}"),  # on the login pod, and in a job
                        user.run(f"srun --nodes=1 ls -A {where} </dev/null")):
            assert listing.stdout == "" and (
                listing.rc == 0 or "No such file or directory" in listing.stderr), listing
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
    assert controller.check_output(f"ls -A {exposed.state_dir}") == ""
    checkout = Path(__file__).parents[2]
    assert "Read-only file system" in controller.run(f"touch {checkout}/slonk-was-here").stderr
