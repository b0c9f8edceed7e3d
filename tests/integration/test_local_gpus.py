"""A GPU pool in local mode (issue 29): its pod gets fake GPUs from local mode's fake device
plugin (null devices and a fake nvidia-smi, slonk.local.podinit), slurmd comes up with them as
GRES, the GPU check passes on them, and Slurm schedules them: a job gets the GPUs it asks
for (CUDA_VISIBLE_DEVICES), and a job asking for GPUs in use waits while others run.

Local mode confines nothing (these machines are cgroup v1), so a job sees every GPU of its
node, as it would on a real node without ConstrainDevices; a real node's device cgroup is for
the node acceptance test. A job's container (Apptainer, --nv) is told the job's GPUs alone."""

from __future__ import annotations

from ..support.cluster import LocalCluster, cluster_of_its_own, wait_for
from ..support.containers import build_in_a_job

NODE = "slonk-gpu-0"
VALUES = {
    "nodepools": {
        "cpu": None,
        "gpu": {"replicas": 1, "cpus": 2, "memoryMiB": 1024, "gpus": {"count": 2, "type": "h100"}},
    },
    "partitions": {"main": {"pools": ["gpu"]}},
    "accounting": {"enabled": False},
    "metrics": {"enabled": False},
    "syncer": {"enabled": False},
}


gpus = cluster_of_its_own("gpus", VALUES, LocalCluster, idle=(NODE,))


def test_the_node_has_its_gpus_as_gres_and_passes_its_gpu_check(gpus: LocalCluster) -> None:
    controller = gpus.pod("slonk-controller-0")
    assert controller.check_output(f"sinfo --noheader --nodes={NODE} --format=%G") == "gpu:h100:2"
    assert gpus.nodes()[NODE] == ("idle", "")  # the boot checks passed, the gpu check among them
    smi = gpus.pod(NODE).check_output("nvidia-smi -L").splitlines()
    assert smi == [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-fa4e{i})" for i in (0, 1)]


def test_a_job_gets_the_gpus_it_asks_for(gpus: LocalCluster) -> None:
    demo = gpus.user("demo")
    show = "sh -c 'echo $CUDA_VISIBLE_DEVICES; nvidia-smi -L | wc -l' </dev/null"
    assert demo.check_output(f"srun --gres=gpu:1 {show}").split() == ["0", "2"]
    assert demo.check_output(f"srun --gres=gpu:2 {show}").split() == ["0,1", "2"]
    too_many = demo.run("srun --gres=gpu:3 true </dev/null")
    assert too_many.rc != 0, too_many
    assert "Requested node configuration is not available" in too_many.stderr


def test_a_job_waits_for_gpus_in_use_while_others_run(gpus: LocalCluster) -> None:
    controller = gpus.pod("slonk-controller-0")
    holder = gpus.submit("--gres=gpu:2", "--output=/dev/null", "--wrap", "sleep 600")
    try:
        wait_for("the GPUs' holder running", lambda: gpus.jobs().get(holder) == "RUNNING")
        waiting = gpus.submit("--gres=gpu:1", "--output=/dev/null", "--wrap", "true")
        reason = f"squeue --noheader --jobs={waiting} --format=%r"
        wait_for(
            "the GPU job held for resources",
            lambda: controller.run(reason).stdout.strip() == "Resources",
        )
        # A job asking no GPU runs beside the holder meanwhile.
        ran = gpus.user("demo").check_output("srun --cpus-per-task=1 hostname </dev/null")
        assert ran.strip() == NODE
        assert gpus.jobs().get(waiting) == "PENDING"
    finally:
        controller.run(f"scancel {holder}")
    wait_for("the GPU job run once the GPUs are free", lambda: waiting not in gpus.jobs())


def test_a_gpu_jobs_container_is_given_its_own_gpu(gpus: LocalCluster) -> None:
    """Two one-GPU jobs at once, each in an Apptainer container: each is given its own GPU
    (CUDA_VISIBLE_DEVICES, which Slurm sets from the job's GRES and the container keeps)."""
    demo = gpus.user("demo")
    build_in_a_job(demo, "containers")
    show = "apptainer --silent exec --nv containers/image-dir sh -c 'echo $CUDA_VISIBLE_DEVICES'"
    holder = gpus.submit(
        "--gres=gpu:1", "--output=containers/holder.out", "--wrap", f"{show}; sleep 600"
    )
    try:
        wait_for(
            "the first job's container",
            lambda: demo.run("cat containers/holder.out").stdout.strip() or None,
        )
        first = demo.check_output("cat containers/holder.out")
        second = demo.check_output(f"srun --gres=gpu:1 {show} </dev/null")
        assert sorted([first, second]) == ["0", "1"]
    finally:
        gpus.pod("slonk-controller-0").run(f"scancel {holder}")
