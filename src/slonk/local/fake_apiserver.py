"""A FAKE Kubernetes API server for local mode: the few calls slonk's pods make, nothing more.

Local mode has no Kubernetes, but the controller's recycle loop talks to one through the
official client. This stand-in serves exactly those calls, over TLS with a ServiceAccount
token as in a cluster, and refuses what the chart's RBAC rules do not grant, so a Role that
lacks a verb fails here as it would on Kubernetes:
  GET    /api/v1/namespaces/<ns>/pods/<name>   the pod, on node `local`
  DELETE /api/v1/namespaces/<ns>/pods/<name>   restart the pod, as its StatefulSet would
  GET    /api/v1/nodes/<name>                  the node, with its recorded taints
  PATCH  /api/v1/nodes/<name>                  record labels, annotations and taints
Nodes are kept in <state>/apiserver/nodes/<name>.json for tests and people to read.
It restarts pods through slonk.local.kubelet; `slonk local up` starts it (`start`).
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from slonk.local.kubelet import restart_pod
from slonk.local.manifests import Plan
from slonk.local.network import BRIDGE_ADDRESS, NETNS_DIR
from slonk.local.projection import project
from slonk.local.state import Cluster

NODE = "local"
PORT = 6443
ROUTES = [
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/?]+)"), "pods"),
    (re.compile(r"^/api/v1/nodes/(?P<name>[^/?]+)"), "nodes"),
]
VERBS = {"GET": "get", "DELETE": "delete", "PATCH": "patch"}


def pod_object(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": NODE, "containers": []},
        "status": {"phase": "Running"},
    }


class Handler(BaseHTTPRequestHandler):
    server: ApiServer

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, message: str) -> None:
        self._reply(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": message,
                "code": code,
            },
        )

    def _handle(self) -> None:
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        account = self.server.tokens.get(token) if scheme.lower() == "bearer" else None
        if account is None:
            return self._status(401, "Unauthorized")
        match, resource = next(
            ((m, r) for pattern, r in ROUTES if (m := pattern.match(self.path))), (None, "")
        )
        verb = VERBS.get(self.command, "")
        if match is None:
            return self._status(404, f"the fake API server does not serve {self.path}")
        if verb not in self.server.rules.get(account, {}).get(resource, []):
            return self._status(
                403, f'{account} cannot {verb} resource "{resource}" (forbidden by the chart RBAC)'
            )
        if resource == "pods":
            return self._pods(match["ns"], match["name"], verb)
        return self._nodes(match["name"], verb)

    def _pods(self, namespace: str, name: str, verb: str) -> None:
        if name not in self.server.cluster.pod_names():
            return self._status(404, f'pods "{name}" not found')
        if verb == "delete":
            threading.Thread(
                target=restart_pod, args=(self.server.cluster, name), daemon=True
            ).start()
            self.log_message("restarting pod %s", name)
        self._reply(200, pod_object(namespace, name))

    def _nodes(self, name: str, verb: str) -> None:
        path = self.server.cluster.apiserver_dir / "nodes" / f"{name}.json"
        node: dict[str, Any] = (
            json.loads(path.read_text())
            if path.exists()
            else {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}
        )
        if verb == "patch":
            patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            for key in ("labels", "annotations"):
                node["metadata"].setdefault(key, {}).update(patch.get("metadata", {}).get(key, {}))
            if "taints" in patch.get("spec", {}):
                node["spec"]["taints"] = patch["spec"]["taints"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(node, indent=1))
            self.log_message("patched node %s", name)
        self._reply(200, node)

    do_GET = do_DELETE = do_PATCH = _handle


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        cluster: Cluster,
        address: str,
        tokens: dict[str, str],
        rules: dict[str, dict[str, list[str]]],
    ) -> None:
        super().__init__((address, PORT), Handler)
        self.cluster, self.tokens, self.rules = cluster, tokens, rules


def start(cluster: Cluster, objects: Plan, namespace: str) -> None:
    """Serve on the bridge's address (in the switch's namespace), with a token for every
    ServiceAccount a pod mounts and the chart's RBAC rules; `down` stops it with the rest."""
    accounts = {p.service_account for p in objects.pods if p.service_account}
    if not accounts:
        return
    folder = cluster.apiserver_dir
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "tls.crt", folder / "tls.key"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "3650", "-subj", "/CN=kubernetes", "-keyout", str(key),
             "-out", str(cert), "-addext", f"subjectAltName=IP:{BRIDGE_ADDRESS}"],
            check=True, capture_output=True,
        )  # fmt: skip
    tokens = {}
    for account in sorted(accounts):
        token = secrets.token_urlsafe(32)
        tokens[token] = account
        project(
            cluster.serviceaccount_dir(account),
            {"token": token.encode(), "ca.crt": cert.read_bytes(), "namespace": namespace.encode()},
        )
    config = {"tokens": tokens, "rules": objects.permissions()}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    with open(folder / "log", "ab") as log:
        subprocess.Popen(
            ["nsenter", f"--net={NETNS_DIR / cluster.network.switch}", "--", sys.executable,
             "-m", "slonk.local.fake_apiserver", str(cluster.state_dir), BRIDGE_ADDRESS],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def main() -> None:
    """<state dir> <address>: serve until killed (local mode's `down` does that)."""
    cluster, address = Cluster(Path(sys.argv[1])), sys.argv[2]
    folder = cluster.apiserver_dir
    config = json.loads((folder / "config.json").read_text())
    server = ApiServer(cluster, address, config["tokens"], config["rules"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(f"fake API server on https://{address}:{PORT}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
