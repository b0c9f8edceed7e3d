"""The HTTP side: authentication by bearer token, the chart's RBAC, a request routed
(slonk.local.apiserver.routes) to its verb (verbs), lists in pages and watches streamed, and
errors as Status objects. Bodies over 3 MiB are refused (413) before they are read, as the
real API server's limit."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from slonk.local.apiserver import deletion, events, paging, resources, tables, verbs
from slonk.local.apiserver.rbac import Request
from slonk.local.apiserver.routes import Target, route
from slonk.local.apiserver.selectors import fields, flag, labels
from slonk.local.apiserver.status import ApiError
from slonk.local.apiserver.store import Object
from slonk.local.apiserver.verbs import Api

MAX_BODY = 3 * 1024 * 1024
DRAIN_LIMIT = 16 * 1024 * 1024
DEFAULT_WATCH_SECONDS = 1800
BOOKMARK_SECONDS = 5.0
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
PUBLIC = {"/version", "/healthz", "/livez", "/readyz"}


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
        content_type = self.headers.get("Content-Type", "")
        code, result = verbs.answer(api, verb, target, body, content_type)
        if verb == "get" and "as=Table" in self.headers.get("Accept", ""):
            row = events.to_core(result) if events.served_as_v1(target.resource) else result
            result = tables.table(
                result["kind"],
                [row],
                int(result["metadata"].get("resourceVersion", 0)),
                query.get("includeObject") == "Object",
            )
        self._send(code, result)

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
                    else verbs.typed(obj, target.resource)
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

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


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
