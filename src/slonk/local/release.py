"""The chart as a local release: its values for local mode, its objects rendered and checked
as the pods will check them, and their files in the state directory (ConfigMaps, Secrets,
the ssh keys `slonk local ssh` uses)."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slonk.base import paths
from slonk.config.spec import ClusterSpec, SpecError, parse_spec
from slonk.kube import chart
from slonk.local.manifests import Plan, plan
from slonk.local.projection import DATA_LINK, project
from slonk.local.state import Cluster

RELEASE = "slonk"
NAMESPACE = "default"
SPEC_CONFIGMAP = f"{RELEASE}-cluster"
SPEC_KEY = "cluster.yaml"
LOCAL_VALUES = Path(__file__).with_name("values.yaml")


def _client_key(cluster: Cluster) -> str:
    if not cluster.client_key.exists():
        cluster.client_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "slonk-local",
                "-f",
                str(cluster.client_key),
            ],
            check=True,
        )
    return cluster.client_key.with_suffix(".pub").read_text().strip()


def layered(user: Mapping[str, Any]) -> dict[str, Any]:
    """Local mode's default values, then the user's over them."""
    return chart.deep_merge(chart.user_values([LOCAL_VALUES]), copy.deepcopy(user))


def values(cluster: Cluster, user: Mapping[str, Any]) -> dict[str, Any]:
    """Chart values for local mode: its defaults, then the user's. Users without keys,
    static or in the development directory, get the local client key for `slonk local ssh`."""
    merged = layered(user)
    key = _client_key(cluster)

    def with_key(users: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"sshKeys": [key], **u} for u in users]

    merged["users"] = with_key(merged.get("users", []))
    dev = merged.get("ldap", {}).get("dev", {})
    if dev.get("users"):
        dev["users"] = with_key(dev["users"])
    return merged


def render(cluster: Cluster, user: Mapping[str, Any]) -> tuple[Plan, ClusterSpec]:
    """The chart's objects for these user values, and the cluster.yaml they carry, checked
    as every pod will check it: values the pods would refuse fail here, before anything is
    made or changed."""
    return render_values(values(cluster, user))


def render_values(chart_values: Mapping[str, Any]) -> tuple[Plan, ClusterSpec]:
    """render's work on values already complete (local mode's defaults and keys in them)."""
    rendered = chart.render(chart.default_chart(), chart_values, RELEASE, NAMESPACE)
    docs = [d for d in yaml.load_all(chart.manifest(rendered), Loader=yaml.CSafeLoader) if d]
    objects = plan(docs, NAMESPACE)
    return objects, cluster_spec(objects)


def cluster_spec(objects: Plan) -> ClusterSpec:
    """The spec in the rendered ConfigMap, parsed as the pods parse it (SpecError naming the
    ConfigMap and the key)."""
    where = f"ConfigMap {SPEC_CONFIGMAP}, {SPEC_KEY}"
    try:
        data = yaml.safe_load(objects.configmaps[SPEC_CONFIGMAP][SPEC_KEY])
    except yaml.YAMLError as err:
        raise SpecError(f"{where}: not valid YAML: {err}") from err
    try:
        return parse_spec(data)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from err


def project_objects(cluster: Cluster, objects: Plan) -> None:
    for name, files in objects.configmaps.items():
        project(cluster.configmap_dir(name), files)
    project_secrets(cluster, objects)


def project_secrets(cluster: Cluster, objects: Plan) -> None:
    for name, files in objects.secrets.items():
        target = cluster.secret_dir(name)
        if not (target / DATA_LINK).exists():  # like the chart's `lookup`: made once, kept
            project(target, files, mode=0o400)


def known_hosts(cluster: Cluster, objects: Plan, addresses: dict[str, str]) -> None:
    lines = []
    for pod in objects.pods:
        for mount in pod.mounts:
            if mount.kind == "secret" and mount.target == str(paths.SSH_SECRET_DIR):
                for key in sorted(cluster.mount_source(mount, pod.name).glob("*_key")):
                    public = subprocess.run(
                        ["ssh-keygen", "-y", "-f", str(key)],
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout.strip()
                    lines.append(f"{addresses[pod.name]} {public}")
    cluster.known_hosts.write_text("".join(f"{line}\n" for line in lines))
