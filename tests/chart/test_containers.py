"""/dev/fuse for Apptainer in jobs (values workers.fuseResource): each worker asks the site's
device plugin for one; none by default; a name Kubernetes would refuse is refused first."""

from __future__ import annotations

import pytest

from .test_security import _docs, _get
from .test_validity import _template_error

GPU_POOL = {"replicas": 1, "cpus": 8, "memoryMiB": 4096, "gpus": {"count": 4}}


def _limits(docs, statefulset: str) -> dict:
    pod = _get(docs, "StatefulSet", statefulset)["spec"]["template"]["spec"]
    slurmd = next(c for c in pod["containers"] if c["name"] == "slurmd")
    return slurmd["resources"].get("limits", {})


def test_no_fuse_by_default():
    docs = _docs()
    assert "smarter-devices/fuse" not in _limits(docs, "slonk-cpu")


def test_each_worker_asks_for_one_beside_its_gpus():
    docs = _docs(
        {
            "workers": {"fuseResource": "smarter-devices/fuse"},
            "nodepools": {"gpu": GPU_POOL},
            "partitions": {"main": {"pools": ["cpu", "gpu"]}},
        }
    )
    assert _limits(docs, "slonk-cpu") == {"smarter-devices/fuse": 1}
    assert _limits(docs, "slonk-gpu") == {"smarter-devices/fuse": 1, "nvidia.com/gpu": 4}
    opted_out = _docs(
        {
            "workers": {"fuseResource": "smarter-devices/fuse"},
            "nodepools": {
                "gpu": {**GPU_POOL, "resources": {"limits": {"smarter-devices/fuse": 0}}}
            },
            "partitions": {"main": {"pools": ["cpu", "gpu"]}},
        }
    )
    assert _limits(opted_out, "slonk-gpu") == {"smarter-devices/fuse": 0, "nvidia.com/gpu": 4}
    controller = _get(docs, "StatefulSet", "slonk-controller")["spec"]["template"]["spec"]
    assert all(
        "smarter-devices/fuse" not in (c.get("resources") or {}).get("limits", {})
        for c in controller["containers"]
    )


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("fuseResource", "fuse"),  # Kubernetes wants a domain for a resource outside its own
        ("fuseResource", "smarter-devices/fuse: 1\n  cpu: 100"),
        ("fuseResource", "-x/fuse"),
        ("gpuResource", "gpu"),
        ("gpuResource", ""),
    ],
)
def test_a_resource_name_kubernetes_would_refuse_is_refused(key, name):
    said = _template_error("--set-string", f"workers.{key}={name}")
    assert f"workers.{key}" in said.replace("/", ".")


def test_the_gpus_resource_is_not_taken_for_fuse():
    """The same name for both would ask one GPU of every worker, and of a GPU pool's GPUs one."""
    said = _template_error("--set-string", "workers.fuseResource=nvidia.com/gpu")
    assert 'workers.fuseResource: "nvidia.com/gpu" is workers.gpuResource too' in said
