"""A FAKE Kubernetes API server for local mode, so that what talks to Kubernetes (the
controller's recycle loop and syncer through the official client, people through real
`kubectl`) is tested against the API's real wire shapes. Not Kubernetes: one process, objects
in memory, made from the rendered chart, gone with `down`. The parts live in
slonk.local.apiserver; this module runs them for a local cluster:

- over TLS on the bridge's address (port 6443), with a token for every ServiceAccount a pod
  mounts, refusing what the chart's RBAC does not grant, and an admin token for
  `slonk local kubeconfig` (the operator's, at the host; never mounted in a pod);
- with the kubelet side here: pods are local mode's processes, stopped and started through
  slonk.local.kubelet, their status read from them every second;
- keeping <state>/apiserver/nodes/<node>.json current, for tests and people to read, and
  reloading the chart's StatefulSets and PDBs when `slonk local upgrade` publishes new ones.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slonk.base.files import write_atomically
from slonk.local.apiserver import objects as api_objects
from slonk.local.apiserver.controllers import PDBS, RELIST_SECONDS, STS, Controllers
from slonk.local.apiserver.http import Server
from slonk.local.apiserver.rbac import ADMIN, Authorizer
from slonk.local.apiserver.store import HISTORY, Change, Store
from slonk.local.apiserver.verbs import Api, replicas
from slonk.local.kubelet import start_saved, stop_pods
from slonk.local.manifests import LocalModeError, Plan
from slonk.local.network import BRIDGE_ADDRESS, NETNS_DIR, enter_network
from slonk.local.projection import project
from slonk.local.state import Cluster

PORT = 6443
HOST_ADDRESS = "127.0.0.1"
HOST_FILE = "host-address"  # where the host's listener is, "127.0.0.1:<port>"
CHART_FILE = "chart.json"  # the StatefulSets and PDBs in force, as `up` and `upgrade` rendered


class KubeletBackend:
    """Local mode's pods as the fake's controllers see them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def pods(self) -> dict[str, str]:
        return {name: pod["address"] for name, pod in self.cluster.record()["pods"].items()}

    def running(self, name: str) -> int | None:
        return self.cluster.pid(name)

    def stop(self, name: str) -> None:
        stop_pods(self.cluster, [name])

    def start(self, name: str) -> None:
        start_saved(self.cluster, name)


def publish(cluster: Cluster, plan: Plan) -> None:
    """The chart's StatefulSets and PDBs for the fake (it reloads them on change)."""
    chart = {"statefulsets": plan.statefulsets, "budgets": plan.disruption_budgets}
    write_atomically(cluster.apiserver_dir / CHART_FILE, json.dumps(chart, indent=1))


def load_chart(store: Store, chart: Mapping[str, Any], namespace: str) -> list[dict[str, Any]]:
    """The rendered objects into the store, as `helm upgrade` applies them: spec and metadata
    from the chart, status kept. Returns the StatefulSets whose replicas this changed (a
    `kubectl scale` since, undone by the chart's value), for their controller to follow."""
    rescaled = []
    for key, made, rendered in (
        (STS, api_objects.statefulset_object, chart["statefulsets"]),
        (PDBS, api_objects.budget_object, chart["budgets"]),
    ):
        wanted = {doc["metadata"]["name"]: made(doc, namespace) for doc in rendered}
        for name, obj in wanted.items():
            current = store.find(key, namespace, name)
            if current is None:
                store.create(key, obj)
                continue
            metadata = {**current["metadata"], **obj["metadata"]}
            status = current.get("status", {})
            written = store.update(key, {**obj, "metadata": metadata, "status": status})
            if key == STS and replicas(written) != replicas(current):
                rescaled.append(written)
        for obj in store.list(key, namespace)[0]:
            if obj["metadata"]["name"] not in wanted:
                store.delete(key, namespace, obj["metadata"]["name"])
    return rescaled


def certificate(folder: Path, *addresses: str) -> None:
    cert, key = folder / "tls.crt", folder / "tls.key"
    names = ",".join(f"IP:{a}" for a in addresses)
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "3650", "-subj", "/CN=kubernetes", "-keyout", str(key),
             "-out", str(cert), "-addext", f"subjectAltName={names}"],
            check=True, capture_output=True,
        )  # fmt: skip
        key.chmod(0o600)


def start(cluster: Cluster, objects: Plan, namespace: str) -> None:
    """Serve on the bridge's address (in the switch's namespace), with a token for every
    ServiceAccount a pod mounts, the admin token and the chart's RBAC rules; `down` stops it
    with the rest."""
    folder = cluster.apiserver_dir
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    certificate(folder, BRIDGE_ADDRESS, HOST_ADDRESS)
    cert = (folder / "tls.crt").read_bytes()
    tokens = {secrets.token_urlsafe(32): ADMIN}
    for account in sorted({p.service_account for p in objects.pods if p.service_account}):
        token = secrets.token_urlsafe(32)
        tokens[token] = account
        project(
            cluster.serviceaccount_dir(account),
            {"token": token.encode(), "ca.crt": cert, "namespace": namespace.encode()},
        )
    config = {"tokens": tokens, "rules": objects.permissions(), "namespace": namespace}
    write_atomically(folder / "config.json", json.dumps(config, indent=1), mode=0o600)
    publish(cluster, objects)
    (folder / HOST_FILE).unlink(missing_ok=True)
    with open(folder / "log", "ab") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "slonk.local.fake_apiserver",
                str(cluster.state_dir),
                str(NETNS_DIR / cluster.network.switch),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # Serving on both addresses before `up` goes on: the pods' first calls find it there.
    while not (folder / HOST_FILE).exists():
        if server.poll() is not None:
            raise LocalModeError(f"the fake API server stopped: see {folder / 'log'}")
        time.sleep(0.02)


def kubeconfig(cluster: Cluster, server: str | None = None) -> str:
    """An admin kubeconfig for the operator at the host: the fake's address on the host's
    loopback (the bridge's lives in the cluster's own network namespace)."""
    folder = cluster.apiserver_dir
    try:
        config = json.loads((folder / "config.json").read_text())
        cert = (folder / "tls.crt").read_bytes()
        server = server or (folder / HOST_FILE).read_text().strip()
    except FileNotFoundError:
        raise LocalModeError(
            f"no fake API server in {cluster.state_dir}: `slonk local up` first"
        ) from None
    token = next(t for t, account in config["tokens"].items() if account == ADMIN)
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "slonk-local",
            "clusters": [
                {
                    "name": "slonk-local",
                    "cluster": {
                        "server": f"https://{server}",
                        "certificate-authority-data": base64.b64encode(cert).decode(),
                    },
                }
            ],
            "users": [{"name": "slonk-local-admin", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "slonk-local",
                    "context": {
                        "cluster": "slonk-local",
                        "user": "slonk-local-admin",
                        "namespace": config.get("namespace", "default"),
                    },
                }
            ],
        },
        sort_keys=False,
    )


def serve(cluster: Cluster, backend: Any = None, history: int = HISTORY) -> tuple[Api, Controllers]:
    """The fake for `cluster`'s apiserver folder, its relist running; `listen` serves it."""
    folder = cluster.apiserver_dir
    config = json.loads((folder / "config.json").read_text())
    namespace = config.get("namespace", "default")
    nodes = folder / "nodes"
    nodes.mkdir(exist_ok=True)

    def snapshot(change: Change) -> None:
        if change.resource == "/nodes":
            path = nodes / f"{change.object['metadata']['name']}.json"
            if change.type == "DELETED":
                path.unlink(missing_ok=True)
            else:
                write_atomically(path, json.dumps(change.object, indent=1))

    store = Store(history, on_change=snapshot)
    store.create("/namespaces", api_objects.namespace_object(namespace))
    controllers = Controllers(store, backend or KubeletBackend(cluster), namespace)
    api = Api(store, Authorizer(config["rules"], namespace), controllers, config["tokens"])
    chart_file = folder / CHART_FILE
    loaded = [0.0]

    def reload() -> None:
        stamp = chart_file.stat().st_mtime
        if stamp != loaded[0]:
            for sts in load_chart(store, json.loads(chart_file.read_text()), namespace):
                controllers.scaled(sts)
            loaded[0] = stamp

    reload()
    controllers.relist()

    def loop() -> None:
        while not controllers.stopped.wait(RELIST_SECONDS):
            try:
                reload()
                controllers.relist()
            except Exception as err:  # a bad moment (a pod half-made) must not end the loop
                print(f"relist: {type(err).__name__}: {err}", file=sys.stderr, flush=True)

    threading.Thread(target=loop, daemon=True).start()
    return api, controllers


def listen(api: Api, cluster: Cluster, address: str, port: int) -> Server:
    """A TLS listener for `api` on address:port (port 0: any free one), in the network
    namespace the caller is in now."""
    server = Server((address, port), api)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cluster.apiserver_dir / "tls.crt", cluster.apiserver_dir / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def main() -> None:
    """<state dir> <the switch's netns>: serve on the host's loopback (a free port, written
    to apiserver/host-address for `slonk local kubeconfig`) and, from inside the cluster's
    network, on the bridge's address, where the pods reach it; until killed (`down`)."""
    cluster, netns = Cluster(Path(sys.argv[1])), Path(sys.argv[2])
    api, _ = serve(cluster)
    host = listen(api, cluster, HOST_ADDRESS, 0)
    enter_network(netns)  # the host listener's socket stays in the host's namespace
    bridge = listen(api, cluster, BRIDGE_ADDRESS, PORT)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    where = f"{HOST_ADDRESS}:{host.server_address[1]}"
    write_atomically(cluster.apiserver_dir / HOST_FILE, where + "\n")
    print(f"fake API server on https://{BRIDGE_ADDRESS}:{PORT} and https://{where}", flush=True)
    bridge.serve_forever()


if __name__ == "__main__":
    main()
