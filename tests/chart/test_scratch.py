"""The site's per-user scratch (values scratch): mounted at /scratch on the login pods and
workers alone, from a claim or an NFS export, and named in cluster.yaml so that the users
sync makes each user's directory there."""

from __future__ import annotations

import pytest
import yaml

from slonk.config.spec import parse_spec

from .test_security import _docs, _get
from .test_validity import _template_error

SETS = ("slonk-controller", "slonk-login", "slonk-cpu")


def _scratch(docs) -> dict[str, tuple[dict | None, list]]:
    """Per StatefulSet: its scratch volume and where its containers mount it."""
    found = {}
    for name in SETS:
        pod = _get(docs, "StatefulSet", name)["spec"]["template"]["spec"]
        volume = next((v for v in pod["volumes"] if v["name"] == "scratch"), None)
        mounts = [
            m
            for c in pod["containers"]
            for m in c.get("volumeMounts", [])
            if m["name"] == "scratch"
        ]
        found[name] = (volume, mounts)
    return found


def _spec(docs):
    return parse_spec(
        yaml.safe_load(_get(docs, "ConfigMap", "slonk-cluster")["data"]["cluster.yaml"])
    )


def test_none_by_default():
    docs = _docs()
    assert all(found == (None, []) for found in _scratch(docs).values())
    assert _spec(docs).scratch is False


@pytest.mark.parametrize(
    ("values", "volume"),
    [
        (
            {"existingClaim": "site-scratch"},
            {"persistentVolumeClaim": {"claimName": "site-scratch"}},
        ),
        (
            {"nfs": {"server": "nfs.example.org", "path": "/export/scratch"}},
            {"nfs": {"server": "nfs.example.org", "path": "/export/scratch"}},
        ),
    ],
)
def test_login_pods_and_workers_mount_it_and_the_sync_is_told(values, volume):
    docs = _docs({"scratch": values})
    found = _scratch(docs)
    assert found["slonk-controller"] == (None, [])
    for name in ("slonk-login", "slonk-cpu"):
        assert found[name] == (
            {"name": "scratch", **volume},
            [{"name": "scratch", "mountPath": "/scratch"}],
        )
    assert _spec(docs).scratch is True


def test_an_export_without_its_path_is_refused(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"scratch": {"nfs": {"server": "nfs.example.org"}}}))
    assert "scratch" in _template_error("-f", str(values))


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (
            {"scratch": {"existingClaim": "a", "nfs": {"server": "nfs", "path": "/s"}}},
            "scratch: set existingClaim or nfs, not both",
        ),
        (
            {"home": {"existingClaim": "homes"}, "scratch": {"existingClaim": "homes"}},
            'scratch.existingClaim: "homes" is /home\'s claim',
        ),
    ],
)
def test_two_volumes_or_home_itself_are_refused(tmp_path, values, said):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert said in _template_error("-f", str(path))
