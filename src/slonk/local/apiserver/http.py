"""The request handler: authentication by bearer token, the chart's RBAC, routing of the
API's URL layout to the store and the controllers, and errors as Status objects. Bodies over
3 MiB are refused (413) before they are read, as the real API server's limit; names must be
DNS subdomains, so that no name reaches a file path or the store as anything else."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from slonk.local.apiserver import deletion, events, metadata, paging, patches, resources, tables
from slonk.local.apiserver.controllers import Controllers
from slonk.local.apiserver.rbac import Authorizer, Request
from slonk.local.apiserver.resources import Resource
from slonk.local.apiserver.selectors import fields, flag, labels
from slonk.local.apiserver.status import ApiError, invalid
from slonk.local.apiserver.store import Object, Store

MAX_BODY = 3 * 1024 * 1024
DRAIN_LIMIT = 16 * 1024 * 1024
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
DEFAULT_WATCH_SECONDS = 1800
BOOKMARK_SECONDS = 5.0
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
PUBLIC = {"/version", "/healthz", "/livez", "/readyz"}
# Writes to the main resource leave status alone; the status subresource writes only status.
HAS_STATUS = {"Pod", "Node", "StatefulSet", "PodDisruptionBudget", "Namespace"}


@dataclass(frozen=True)
class Target:
    resource: Resource
    namespace: str
    name: str
    subresource: str

    @property
    def key(self) -> str:
        if events.served_as_v1(self.resource):
            return events.CORE_KEY
        return f"{self.resource.group}/{self.resource.name}"


class Api:
    """Everything a request may touch: the store, who is who, what they may do."""

    def __init__(
        self,
        store: Store,
        authorizer: Authorizer,
        controllers: Controllers,
        tokens: Mapping[str, str],
    ) -> None:
        self.store, self.authorizer, self.controllers = store, authorizer, controllers
        self.tokens = tokens

    def account(self, header: str) -> str:
        scheme, _, token = header.partition(" ")
        for known, account in self.tokens.items():
            if scheme.lower() == "bearer" and secrets.compare_digest(known, token.strip()):
                return account
        raise ApiError(401, "Unauthorized")


def _name(name: str) -> str:
    if not (len(name) <= 253 and NAME.fullmatch(name)):
        raise ApiError(400, f"invalid resource name {name!a}: a DNS subdomain is expected")
    return name


def route(path: str) -> Target | Object | None:
    """A resource URL as its target, a discovery URL as its document, None if unknown."""
    parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
    if parts[:1] == ["api"]:
        if len(parts) == 1:
            return resources.api_versions("")
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"]:
        if len(parts) == 1:
            return resources.api_group_list()
        if len(parts) == 2:
            return resources.api_group(parts[1])
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return resources.resource_list(group, version)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = _name(rest[1]), rest[2:]
    resource = resources.find(group, version, rest[0])
    if resource is None or len(rest) > 3 or (namespace and not resource.namespaced):
        return None
    if resource.namespaced and not namespace and len(rest) > 1:
        return None  # a namespaced object is read in its namespace; all of them only listed
    name = _name(rest[1]) if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if sub and resources.subresource(resource, sub) is None:
        return None
    return Target(resource, namespace, name, sub)


def scale_of(sts: Object) -> Object:
    meta = sts["metadata"]
    match = sts["spec"].get("selector", {}).get("matchLabels", {})
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": int(sts["spec"].get("replicas", 1))},
        "status": {
            "replicas": int(sts.get("status", {}).get("replicas", 0)),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(match.items())),
        },
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    # -- replies -------------------------------------------------------------------------
    def _send(self, code: int, body: Any, close: bool = False) -> None:
        data = (json.dumps(body) + "\n").encode() if not isinstance(body, bytes) else body
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if body != b"ok" else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # -- the request ---------------------------------------------------------------------
    def _handle(self) -> None:
        api = self.server.api
        try:
            body = self._body()
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if url.path in PUBLIC:
                if url.path == "/version":
                    return self._send(200, resources.VERSION)
                return self._send(200, b"ok")
            account = api.account(self.headers.get("Authorization", ""))
            found = route(url.path)
            if found is None:
                raise ApiError(404, f"the fake API server does not serve {url.path!a}", "NotFound")
            if not isinstance(found, Target):
                if self.command != "GET":
                    raise ApiError(405, f"{self.command} is not allowed on {url.path!a}")
                if found.get("kind") == "APIVersions":
                    found = resources.api_versions("{}:{}".format(*self.server.server_address[:2]))
                return self._send(200, found)
            self._resource(api, account, found, query, body)
        except ApiError as err:
            self._send(err.code, err.status(), close=err.code in (401, 411, 413))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # a bug of the fake's: the client hears it as the API's 500
            traceback.print_exc()
            failure = ApiError(500, f"the fake API server failed: {type(err).__name__}: {err}")
            with contextlib.suppress(OSError):
                self._send(500, failure.status(), close=True)

    def _body(self) -> Any:
        if self.headers.get("Transfer-Encoding"):
            raise ApiError(411, "a request body needs a Content-Length here", "LengthRequired")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ApiError(400, "the Content-Length is no number") from None
        if length > MAX_BODY:
            # Read (and drop) a moderately large body so that the client hears the 413;
            # past DRAIN_LIMIT the connection just closes after the answer.
            left = length if length <= DRAIN_LIMIT else 0
            while left > 0 and (chunk := self.rfile.read(min(left, 1 << 16))):
                left -= len(chunk)
            raise ApiError(
                413, f"the request body of {length} bytes exceeds the limit of {MAX_BODY} bytes"
            )
        if length <= 0:
            return None
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "the request body is not JSON (the fake takes JSON only)") from None

    def _resource(
        self, api: Api, account: str, target: Target, query: Mapping[str, str], body: Any
    ) -> None:
        watching = flag(query.get("watch"))
        verb = VERBS.get(self.command) or (
            "get" if target.name else "watch" if watching else "list"
        )
        if self.command not in ("GET", *VERBS):
            raise ApiError(405, f"{self.command} is not allowed")
        api.authorizer.check(
            account,
            Request(
                verb,
                target.resource.group,
                target.resource.name,
                target.subresource,
                target.namespace,
                target.name,
            ),
        )
        allowed = (
            resources.subresource(target.resource, target.subresource).verbs  # type: ignore[union-attr]
            if target.subresource
            else target.resource.verbs
        )
        if verb not in allowed or (verb in ("update", "patch", "delete") and not target.name):
            raise ApiError(
                405,
                f"the fake API server does not {verb} "
                f"{target.resource.name}{'/' + target.subresource if target.subresource else ''}"
                " (local mode makes these objects from the chart)",
            )
        if query.get("dryRun"):
            raise ApiError(400, "the fake API server does no dry runs: it would have written")
        if verb == "watch":
            return self._watch(api, target, query)
        if verb == "list":
            return self._list(api, target, query)
        if verb == "delete":  # its options may come in the query too
            body = {**deletion.from_query(query), **(body if isinstance(body, dict) else {})}
        handler: Callable[[Api, Target, Any], tuple[int, Object]] = getattr(self, f"_{verb}")
        code, result = handler(api, target, body)
        if verb == "get" and "as=Table" in self.headers.get("Accept", ""):
            row = events.to_core(result) if events.served_as_v1(target.resource) else result
            result = tables.table(
                result["kind"],
                [row],
                int(result["metadata"].get("resourceVersion", 0)),
                query.get("includeObject") == "Object",
            )
        self._send(code, result)

    # -- verbs ---------------------------------------------------------------------------
    def _get(self, api: Api, target: Target, _: Any) -> tuple[int, Object]:
        obj = api.store.get(target.key, target.namespace, target.name)
        if target.subresource == "scale":
            return 200, scale_of(obj)
        return 200, _typed(obj, target.resource)

    def _matching(self, query: Mapping[str, str]) -> Callable[[Object], bool]:
        by_label = labels(query.get("labelSelector", ""))
        by_field = fields(query.get("fieldSelector", ""))
        return lambda obj: by_label(obj) and by_field(obj)

    def _list(self, api: Api, target: Target, query: Mapping[str, str]) -> None:
        match = self._matching(query)
        items, rv = api.store.list(target.key, target.namespace or None)
        items, more = paging.page(
            [i for i in items if match(i)],
            rv,
            query,
            lambda since: api.store.changed_after(target.key, since),
            counted=not (query.get("labelSelector") or query.get("fieldSelector")),
        )
        if "as=Table" in self.headers.get("Accept", ""):
            full = query.get("includeObject") == "Object"
            table = tables.table(target.resource.kind, items, rv, full)
            table["metadata"].update(more)
            return self._send(200, table)
        if events.served_as_v1(target.resource):
            items = [events.to_events_v1(item) for item in items]
        for item in items:
            item.pop("apiVersion", None), item.pop("kind", None)
        self._send(
            200,
            {
                "kind": target.resource.list_kind,
                "apiVersion": target.resource.api_version,
                "metadata": {"resourceVersion": str(rv), **more},
                "items": items,
            },
        )

    def _watch(self, api: Api, target: Target, query: Mapping[str, str]) -> None:
        match = self._matching(query)
        as_table = "as=Table" in self.headers.get("Accept", "")
        try:
            timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        except ValueError:
            raise ApiError(400, "timeoutSeconds is no number") from None
        deadline = time.monotonic() + timeout
        bookmarks = flag(query.get("allowWatchBookmarks"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

        def send(kind: str, obj: Object) -> None:
            """An object as stored (a change) or as sent (a bookmark)."""
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                obj = (
                    tables.table(
                        target.resource.kind,
                        [obj],
                        int(obj["metadata"]["resourceVersion"]),
                        query.get("includeObject") == "Object",
                    )
                    if as_table
                    else _typed(obj, target.resource)
                )
            self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        start = query.get("resourceVersion", "")
        try:
            if start in ("", "0"):
                items, cursor = api.store.list(target.key, target.namespace or None)
                for item in items:
                    if match(item):
                        send("ADDED", item)
            else:
                cursor = int(start) if start.isdigit() else -1
                if cursor < 0:
                    raise ApiError(400, f"invalid resourceVersion {start!a}")
            last_bookmark = time.monotonic()
            while (left := deadline - time.monotonic()) > 0:
                if select.select([self.connection], [], [], 0)[0]:
                    self.close_connection = True  # the watcher hung up (it sends nothing
                    return  # while it watches)
                with api.store.changed:
                    changes, head = api.store.changes(target.key, cursor)
                    if not changes:
                        api.store.changed.wait(min(left, BOOKMARK_SECONDS))
                        changes, head = api.store.changes(target.key, cursor)
                for change in changes:
                    kind = _event(change.type, change.object, change.old, target.namespace, match)
                    if kind:
                        send(kind, change.object)
                cursor = head
                if bookmarks and time.monotonic() - last_bookmark >= BOOKMARK_SECONDS:
                    send(
                        "BOOKMARK",
                        {
                            "kind": target.resource.kind,
                            "apiVersion": target.resource.api_version,
                            "metadata": {"resourceVersion": str(cursor)},
                        },
                    )
                    last_bookmark = time.monotonic()
        except ApiError as err:
            self._chunk(json.dumps({"type": "ERROR", "object": err.status()}).encode() + b"\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _create(self, api: Api, target: Target, body: Any) -> tuple[int, Object]:
        if target.subresource == "eviction":
            if not isinstance(body, dict) or body.get("kind") != "Eviction":
                raise ApiError(400, "an eviction's body is a policy/v1 Eviction")
            pod = api.store.get(target.key, target.namespace, target.name)
            deletion.check(body.get("deleteOptions"), pod, "Pod")
            api.controllers.evict(target.name)
            return 201, {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            }
        obj = _checked(body, target)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = _name(f"{meta['generateName']}{secrets.token_hex(3)[:5]}")
        if not meta.get("name"):
            raise invalid(
                target.resource.kind,
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            )
        _name(meta["name"])
        if target.resource.kind == "Event":
            _check_event_namespace(obj, target.namespace)
        if (
            target.resource.namespaced
            and api.store.find("/namespaces", "", target.namespace) is None
        ):
            raise ApiError(404, f'namespaces "{target.namespace}" not found')
        meta.pop("resourceVersion", None)
        return 201, _typed(api.store.create(target.key, obj), target.resource)

    def _update(self, api: Api, target: Target, body: Any) -> tuple[int, Object]:
        current = api.store.get(target.key, target.namespace, target.name)
        if target.subresource == "scale":
            if not isinstance(body, dict) or body.get("kind") != "Scale":
                raise ApiError(400, "the scale subresource takes an autoscaling/v1 Scale")
            return self._scale(api, target, current, body)
        obj = _checked(body, target)
        return 200, self._write(api, target, current, obj)

    def _patch(self, api: Api, target: Target, body: Any) -> tuple[int, Object]:
        """Applied to the object as stored, atomically (the API retries a patch that met a
        concurrent write; holding the lock does the same); a resourceVersion in the patch
        is a precondition."""
        kind = self.headers.get("Content-Type", "").split(";")[0].strip()
        given = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
        with api.store.changed:
            current = api.store.get(target.key, target.namespace, target.name)
            if target.subresource == "scale":
                patched = patches.apply(kind, scale_of(current), body)
                patched.setdefault("metadata", {})["resourceVersion"] = given
                return self._scale(api, target, current, patched)
            patched = _checked(patches.apply(kind, _typed(current, target.resource), body), target)
            patched["metadata"]["resourceVersion"] = given
            return 200, self._write(api, target, current, patched)

    def _scale(
        self, api: Api, target: Target, current: Object, scale: Object
    ) -> tuple[int, Object]:
        replicas = scale.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise invalid("Scale", target.name, "spec.replicas", "must be an integer")
        updated = dict(current, spec={**current["spec"], "replicas": replicas})
        expected = scale.get("metadata", {}).get("resourceVersion")
        updated["metadata"] = {**current["metadata"], "resourceVersion": expected}
        written = self._write(api, target, current, updated, main=True)
        return 200, scale_of(written)

    def _write(
        self, api: Api, target: Target, current: Object, obj: Object, main: bool = False
    ) -> Object:
        """Update with the API's rules: the status subresource writes only status, the main
        resource everything but status; a resourceVersion in the body is a precondition."""
        expected = obj["metadata"].get("resourceVersion")
        kind = target.resource.kind
        if target.subresource == "status":
            obj = dict(current, status=obj.get("status", {}))
        elif kind in HAS_STATUS and "status" in current:
            obj = dict(obj, status=current["status"])
        if kind == "Pod" and not main and obj.get("spec") != current.get("spec"):
            raise invalid(
                "Pod",
                target.name,
                "spec",
                "Forbidden: local mode's pods take their "
                "spec from the chart (labels and annotations may change)",
            )
        if kind == "StatefulSet" and replicas(obj) != replicas(current):
            api.controllers.check_scale(current, replicas(obj))
        obj["metadata"]["namespace"] = target.namespace
        written = api.store.update(target.key, obj, expected)
        if kind == "StatefulSet" and replicas(written) != replicas(current):
            api.controllers.scaled(written)
        return _typed(written, target.resource)

    def _delete(self, api: Api, target: Target, body: Any) -> tuple[int, Object]:
        current = api.store.get(target.key, target.namespace, target.name)
        deletion.check(body, current, target.resource.kind)
        if target.resource.kind == "Pod":
            return 200, _typed(api.controllers.delete_pod(target.name), target.resource)
        gone = api.store.delete(target.key, target.namespace, target.name)
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": target.name,
                "kind": target.resource.name,
                "uid": gone["metadata"]["uid"],
            },
        }

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


def replicas(obj: Object) -> int:
    return int(obj.get("spec", {}).get("replicas", 1))


def _typed(obj: Object, resource: Resource) -> Object:
    if events.served_as_v1(resource):
        return {"apiVersion": resource.api_version, "kind": resource.kind,
                **events.to_events_v1(obj)}  # fmt: skip
    return {"apiVersion": resource.api_version, "kind": resource.kind, **obj}


def _checked(body: Any, target: Target) -> Object:
    """A written object: of the URL's kind, name and namespace."""
    resource = target.resource
    if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
        raise ApiError(400, f"the body must be a {resource.kind} object")
    if (
        body.get("kind", resource.kind) != resource.kind
        or body.get("apiVersion", resource.api_version) != resource.api_version
    ):
        raise ApiError(
            400,
            f"the body is a {body.get('apiVersion')}/{body.get('kind')}, the URL "
            f"a {resource.api_version}/{resource.kind}",
        )
    obj = {**body, "apiVersion": resource.api_version, "kind": resource.kind}
    meta = obj["metadata"] = dict(body.get("metadata") or {})
    if target.name and meta.get("name", target.name) != target.name:
        raise ApiError(
            400,
            f"the name of the object ({meta.get('name')}) does not match the "
            f"name on the URL ({target.name})",
        )
    if target.name:
        meta["name"] = target.name
    if meta.get("namespace", target.namespace) != target.namespace:
        raise ApiError(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    if resource.namespaced:
        meta["namespace"] = target.namespace
    metadata.check(resource.kind, meta)
    if resource.kind == "Event":
        core = events.to_core(obj) if events.served_as_v1(resource) else obj
        return events.with_canonical_times(core)
    return obj


def _check_event_namespace(event: Object, namespace: str) -> None:
    """As the API server's legacy Event validation: an Event about a cluster-scoped object
    (a Node: no involvedObject.namespace) with no eventTime is in `default`; any other is in
    its object's namespace."""
    about = event.get("involvedObject") or {}
    theirs = about.get("namespace") or ""
    if event.get("eventTime"):
        allowed = {"default", "kube-system"} if not theirs else {namespace}
    else:
        allowed = {"default"} if not theirs else {theirs}
    if namespace not in allowed:
        raise invalid(
            "Event",
            event["metadata"].get("name", ""),
            "involvedObject.namespace",
            f"Invalid value: {theirs!r}: does not match event.namespace",
        )


def _event(
    kind: str, new: Object, old: Object | None, namespace: str, match: Callable[[Object], bool]
) -> str | None:
    """What a watcher with a selector sees of a change: an object leaving the selection is
    DELETED for it, one entering ADDED."""
    if namespace and new["metadata"].get("namespace") != namespace:
        return None
    now_in = match(new)
    if kind != "MODIFIED" or old is None:
        return kind if now_in else None
    was_in = match(old)
    if now_in and was_in:
        return "MODIFIED"
    return "ADDED" if now_in else "DELETED" if was_in else None


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], api: Api) -> None:
        super().__init__(address, Handler)
        self.api = api
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.connections_lock:
                self.connections.discard(request)

    def server_close(self) -> None:
        """Closed, it serves no more requests on connections kept alive either (a client's
        watch would otherwise go on being answered by a server its owner stopped)."""
        super().server_close()
        with self.connections_lock:
            for connection in self.connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
