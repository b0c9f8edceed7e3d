"""The built images (scripts/build-images) as real Slurm nodes: a local cluster run from them
with podman, each pod in its own network namespace on the cluster's bridge. The controller
image serves, worker images register and run steps, the login image takes ssh and jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ..support.cluster import ROLES, VERSION, LocalCluster, image, running, slonk, wait_for
from ..support.containers import SAID, build_in_a_job

PODMAN = Path(__file__).with_name("podman-sandboxed")


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PODMAN), *args], capture_output=True, text=True, check=False)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "image tests need root"
    if not shutil.which("podman"):
        return "podman is not installed: run scripts/setup"
    absent = [image(r) for r in ROLES if podman("image", "exists", image(r)).returncode]
    return f"not built: {', '.join(absent)} (scripts/build-images)" if absent else None


MISSING = _missing()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(MISSING), reason=MISSING or "")]


@pytest.fixture(scope="module")
def from_images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state_dir = tmp_path_factory.mktemp("image-cluster")
    os.environ["SLONK_PODMAN"] = str(PODMAN)
    try:
        with running(state_dir, "--runtime", "podman"):
            yield LocalCluster(state_dir)
    finally:
        del os.environ["SLONK_PODMAN"]


def test_every_pod_runs_its_image(from_images: LocalCluster):
    running = podman("ps", "--format", "{{.Names}} {{.Image}}").stdout.splitlines()
    images = {line.split()[0].split("-", 1)[1]: line.split()[1] for line in running}
    assert images == {
        "slonk-controller-0": image("controller"),
        "slonk-ldap-0": image("controller"),
        "slonk-login-0": image("login"),
        "slonk-cpu-0": image("worker"),
        "slonk-cpu-1": image("worker"),
        "slonk-slurmdbd-0": image("controller"),
        "slonk-mariadb-0": image("database"),
    }
    python = from_images.pod("slonk-cpu-0").check_output("readlink -f /usr/local/bin/slonk")
    assert python == "/opt/slonk/bin/slonk"  # the image's own slonk, not the host's


def test_worker_images_registered_with_the_controller_image_and_run_steps(
    from_images: LocalCluster,
):
    assert from_images.nodes() == {"slonk-cpu-0": ("idle", ""), "slonk-cpu-1": ("idle", "")}
    hosts = from_images.user("demo").check_output("srun --nodes=2 --mpi=pmix hostname </dev/null")
    assert sorted(hosts.split()) == ["slonk-cpu-0", "slonk-cpu-1"]


def test_the_login_image_takes_ssh_and_jobs(from_images: LocalCluster):
    job = from_images.submit("--output=/dev/null", "--wrap", "hostname > $HOME/image-job")
    wait_for(f"job {job} to finish", lambda: job not in from_images.jobs())
    assert from_images.user("demo").check_output("cat image-job").startswith("slonk-cpu-")


def test_a_users_container_runs_in_a_job_under_podman(from_images: LocalCluster):
    """The worker image's Apptainer under a real runtime (podman: its seccomp profile, its
    masked /proc), /dev/fuse handed over as a device plugin does (`--device`): a SIF the user
    built in a job from a definition file runs; the login image says where Apptainer runs."""
    demo = from_images.user("demo")
    build_in_a_job(demo, "image-containers")
    said = demo.check_output("srun apptainer --silent run image-containers/image.sif </dev/null")
    assert said == SAID
    login = demo.run("apptainer exec image-containers/image.sif true")
    assert login.rc == 1 and "runs on the workers, in a job: srun apptainer exec" in login.stderr


def test_the_worker_image_leaves_out_apptainers_network_plugins():
    """`apptainer --net` needs root, which no job has: its 55 MB of CNI plugins (what their
    package puts in /usr/lib/cni) stay out."""
    kept = "for f in $(dpkg -L containernetworking-plugins); do [ ! -f $f ] || echo $f; done"
    found = podman(
        "run", "--rm", "--entrypoint", "sh", image("worker"), "-c",
        f"apptainer version && command -v squashfuse_ll && {kept}",
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    _version, squashfuse, *files = found.stdout.split()
    assert squashfuse == "/usr/bin/squashfuse_ll"
    assert "/usr/share/doc/containernetworking-plugins/copyright" in files
    assert [f for f in files if f.startswith("/usr/lib/cni")] == []


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    "files",
    [
        # Secrets come from the cluster's Secrets, never from an image.
        "\\( -name munge.key -o -name 'ssh_host_*' \\)",
        # A job running a setuid program would get the pod's capabilities (SYS_ADMIN on workers).
        "-type f -perm /6000",
    ],
    ids=["secrets", "setuid"],
)
def test_images_carry_none_of(role: str, files: str):
    found = podman(
        "run", "--rm", "--entrypoint", "sh", image(role), "-c", f"find / -xdev {files} -print"
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout == ""


def test_the_images_slonk_is_the_source_trees():
    """No module removed from src/ lives on in an image (a stale build/lib once packed one)."""
    listed = podman(
        "run", "--rm", "--entrypoint", "/opt/slonk/bin/python", image("worker"), "-c",
        "import pathlib, slonk; root = pathlib.Path(slonk.__file__).parent; "
        "print(*sorted(str(p.relative_to(root)) for p in root.rglob('*.py')), sep='\\n')",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    source = Path(__file__).parents[2] / "src" / "slonk"
    assert listed.stdout.split() == sorted(str(p.relative_to(source)) for p in source.rglob("*.py"))


@pytest.mark.parametrize("role", ["controller", "worker", "login"])
def test_the_entrypoint_names_a_missing_mount(role: str, tmp_path: Path):
    bare = podman("run", "--rm", image(role))
    assert bare.returncode == 1
    assert "slonk init: error: /etc/slonk/cluster.yaml: cannot read: No such file" in bare.stderr
    spec = tmp_path / "cluster.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "clusterName": "c",
                "release": "slonk",
                "nodepools": {"cpu": {"replicas": 1, "cpus": 1, "memoryMiB": 512}},
            }
        )
    )
    name = {"controller": "slonk-controller-0", "worker": "slonk-cpu-0", "login": "slonk-login-0"}
    no_key = podman(
        "run",
        "--rm",
        "--hostname",
        name[role],
        "--network",
        "none",
        "--volume",
        f"{tmp_path}:/etc/slonk:ro",
        image(role),
    )
    assert no_key.returncode == 1
    assert (
        "/var/run/secrets/slonk/munge/munge.key: no munge key; mount the Secret "
        "<release>-munge (key munge.key) there"
    ) in no_key.stderr


@pytest.mark.parametrize("role", ROLES)
def test_images_say_what_they_are(role: str):
    labels = yaml.safe_load(
        podman("image", "inspect", "--format", "{{json .Labels}}", image(role)).stdout
    )
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.title"] == f"slonk-{role}"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_the_charts_defaults_are_what_the_build_makes():
    rendered = slonk("chart", "template").stdout
    named = {
        line.split("image: ", 1)[1].strip()
        for line in rendered.splitlines()
        if line.strip().startswith("image: ") and "slonk/" in line
    }
    assert named == {image(role) for role in ROLES if role != "base"}
