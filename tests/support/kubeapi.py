"""Local mode's FAKE Kubernetes API server in-process on 127.0.0.1, with a stub kubelet, for
unit tests that drive it with the official client and real `kubectl`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from slonk.local import fake_apiserver
from slonk.local.apiserver.rbac import ADMIN
from slonk.local.state import Cluster

NAMESPACE = "default"
POOL = {
    "app.kubernetes.io/instance": "slonk",
    "app.kubernetes.io/component": "worker",
    "slonk.io/nodepool": "cpu",
}
STS = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {
        "name": "slonk-cpu",
        "labels": {"app.kubernetes.io/name": "slonk", "app.kubernetes.io/instance": "slonk"},
    },
    "spec": {
        "replicas": 2,
        "serviceName": "slonk-workers",
        "selector": {"matchLabels": POOL},
        "template": {
            "metadata": {"labels": POOL},
            "spec": {
                "nodeSelector": {"example.com/pool": "cpu"},
                "terminationGracePeriodSeconds": 60,
                "containers": [{"name": "slurmd", "image": "localhost/slonk/worker:0.3.0"}],
            },
        },
    },
}
PDB = {
    "apiVersion": "policy/v1",
    "kind": "PodDisruptionBudget",
    "metadata": {"name": "slonk-cpu"},
    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": POOL}},
}
# The test's own Role for the controller's account (the chart's is the lead's to write).
RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"], "namespace": None},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update"],
    },
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "list"]},
]
KUBECTL = os.environ.get("SLONK_KUBECTL") or shutil.which("kubectl")  # another to check


class StubKubelet:
    """Pods as entries: running while they have a pid."""

    def __init__(self) -> None:
        self.addresses = {f"slonk-cpu-{n}": f"10.1.0.{n + 2}" for n in range(3)}
        self.pids: dict[str, int | None] = {"slonk-cpu-0": 100, "slonk-cpu-1": 101}
        self.next_pid = 200
        self.log: list[str] = []

    def pods(self) -> dict[str, str]:
        return dict(self.addresses)

    def running(self, name: str) -> int | None:
        return self.pids.get(name)

    def stop(self, name: str) -> None:
        self.log.append(f"stop {name}")
        self.pids[name] = None

    def start(self, name: str) -> None:
        self.log.append(f"start {name}")
        self.next_pid += 1
        self.pids[name] = self.next_pid


class Fake:
    def __init__(
        self, folder: Path, history: int = 2000, rules: list[dict[str, Any]] | None = None
    ) -> None:
        self.cluster = Cluster(folder)
        api = self.cluster.apiserver_dir
        api.mkdir(parents=True)
        fake_apiserver.certificate(api, "127.0.0.1")
        self.tokens = {
            "admin-token": ADMIN,
            "controller-token": "slonk-controller",
            "login-token": "slonk-login",
        }
        if rules is None:
            rules = [{"namespace": NAMESPACE, "resourceNames": [], **r} for r in RULES]
        (api / "config.json").write_text(
            json.dumps(
                {
                    "tokens": self.tokens,
                    "namespace": NAMESPACE,
                    "rules": {"slonk-controller": rules},
                }
            )
        )
        (api / fake_apiserver.CHART_FILE).write_text(
            json.dumps({"statefulsets": [STS], "budgets": [PDB]})
        )
        self.kubelet = StubKubelet()
        api, self.controllers = fake_apiserver.serve(self.cluster, self.kubelet, history)
        self.server = fake_apiserver.listen(api, self.cluster, "127.0.0.1", 0)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.write_text(
            fake_apiserver.kubeconfig(self.cluster, f"127.0.0.1:{self.port}")
        )
        self.cache = folder / "kube-cache"

    def close(self) -> None:
        self.controllers.stopped.set()
        self.server.shutdown()
        self.server.server_close()

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert KUBECTL
        result = subprocess.run(
            [KUBECTL, f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and result.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result

    def client(self, token: str = "admin-token") -> Any:
        from kubernetes import client

        config = client.Configuration()
        config.host = f"https://127.0.0.1:{self.port}"
        config.ssl_ca_cert = str(self.cluster.apiserver_dir / "tls.crt")
        config.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(config)

    def node(self, name: str) -> dict[str, Any]:
        return json.loads((self.cluster.apiserver_dir / "nodes" / f"{name}.json").read_text())


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return result
