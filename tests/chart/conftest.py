"""Rendered manifests per values set, through `slonk chart template` (Helm's Go library)."""

from __future__ import annotations

import sys
from pathlib import Path

from pytest_helm import manifest_fixture

VALUES = Path(__file__).parent / "values"


def _template(*values: str) -> list[str]:
    command = [sys.executable, "-m", "slonk.cli", "chart", "template", "--namespace", "hpc"]
    for name in values:
        command += ["-f", str(VALUES / name)]
    return command


default_manifest = manifest_fixture("default_manifest", _template())
gpu_manifest = manifest_fixture("gpu_manifest", _template("gpu-pools.yaml"))
existing_manifest = manifest_fixture("existing_manifest", _template("existing.yaml"))
nfs_manifest = manifest_fixture("nfs_manifest", _template("nfs-home.yaml"))
ldap_manifest = manifest_fixture("ldap_manifest", _template("ldap.yaml"))
ldap_dev_manifest = manifest_fixture("ldap_dev_manifest", _template("ldap-dev.yaml"))
hooks_manifest = manifest_fixture("hooks_manifest", _template("hooks.yaml"))
no_recycle_manifest = manifest_fixture("no_recycle_manifest", _template("no-recycle.yaml"))
