"""The syncer's Kubernetes side, through the official client: a reflector per kind (list, then
watch from the list's resourceVersion, as client-go's informers do) and the few writes the
syncer makes. Objects stay the API's JSON (dicts): no model classes built per event."""

from __future__ import annotations

import datetime
import json
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from slonk.kube.api import CONNECT_SECONDS, Api, KubeError

WATCH_SECONDS = 240  # each watch request ends by then; the next resumes from the last version
BACKOFF_SECONDS = (1, 2, 5, 10, 30)
LIST_SECONDS = 120


def log(message: str) -> None:
    print(f"slonk syncer: {message}", file=sys.stderr, flush=True)


class Reflector:
    """One kind's objects by name, kept current by a thread: a full list at start, after a
    410 Gone and every `resync_seconds`; a watch from the last resourceVersion between.
    `synced` is False from any error until the next full list: the plan then knows its
    picture may be stale, and lifts nothing."""

    def __init__(
        self,
        kind: str,
        lister: Callable[..., Any],
        changed: threading.Event,
        resync_seconds: float,
        **selectors: str,
    ) -> None:
        self.kind, self.lister, self.changed = kind, lister, changed
        self.resync_seconds, self.selectors = resync_seconds, selectors
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = False
        self.version = ""
        self.calls = 0
        self._lock = threading.Lock()
        self.stopped = threading.Event()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self.objects)

    def _request(self, **kwargs: Any) -> Any:
        self.calls += 1
        return self.lister(**self.selectors, **kwargs, _preload_content=False)

    def relist(self) -> None:
        response = self._request(_request_timeout=(CONNECT_SECONDS, LIST_SECONDS))
        listed = json.loads(response.data)
        objects = {item["metadata"]["name"]: item for item in listed.get("items") or []}
        with self._lock:
            self.objects, self.synced = objects, True
            self.version = listed["metadata"]["resourceVersion"]
        self.changed.set()

    def watch(self, until: float) -> bool:
        """Apply events until the request ends; False when the version is too old (410)."""
        from kubernetes.watch.watch import iter_resp_lines

        seconds = max(1, min(WATCH_SECONDS, int(until - time.monotonic())))
        seconds += random.randint(0, seconds // 4)  # no herd of re-watches
        response = self._request(
            watch=True,
            resource_version=self.version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            # A connection that died silently ends too: bookmarks come well within this.
            _request_timeout=(CONNECT_SECONDS, seconds + 60),
        )
        try:
            for line in iter_resp_lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, item = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if item.get("code") == 410:
                        return False
                    raise KubeError(f"watch {self.kind}: {item.get('message')}")
                metadata = item.get("metadata") or {}
                with self._lock:
                    self.version = metadata.get("resourceVersion", self.version)
                    if kind == "DELETED":
                        self.objects.pop(metadata.get("name", ""), None)
                    elif kind in ("ADDED", "MODIFIED"):
                        self.objects[metadata["name"]] = item
                if kind != "BOOKMARK":
                    self.changed.set()
        finally:
            response.release_conn()
        return True

    def run(self) -> None:
        """Until stopped, in its own thread."""
        failures = 0
        while not self.stopped.is_set():
            try:
                self.relist()
                failures = 0
                until = time.monotonic() + self.resync_seconds
                while time.monotonic() < until and self.watch(until):
                    pass
            except Exception as err:  # the API or the network: note it, keep trying
                if self.stopped.is_set():
                    return  # its connection closed under it: no news
                with self._lock:
                    self.synced = False
                self.changed.set()
                pause = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                log(f"{self.kind}: {type(err).__name__}: {err}; listing again in {pause} s")
                time.sleep(pause)

    def start(self) -> Reflector:
        threading.Thread(target=self.run, name=f"reflector-{self.kind}", daemon=True).start()
        return self


class Cluster(Api):
    """The release's Kubernetes objects the syncer follows, and its writes."""

    def __init__(
        self, namespace: str, release: str, resync_seconds: float, api: Any = None
    ) -> None:
        super().__init__(namespace, api)
        from kubernetes import client

        self.release = release
        self.changed = threading.Event()
        self.apps = client.AppsV1Api(self.api_client)
        instance = f"app.kubernetes.io/instance={release}"
        self.nodes = Reflector("nodes", self.core.list_node, self.changed, resync_seconds)
        self.pods = Reflector(
            "pods",
            self.core.list_namespaced_pod,
            self.changed,
            resync_seconds,
            namespace=namespace,
            label_selector=f"{instance},app.kubernetes.io/component=worker",
        )
        self.statefulsets = Reflector(
            "statefulsets",
            self.apps.list_namespaced_stateful_set,
            self.changed,
            resync_seconds,
            namespace=namespace,
            label_selector=instance,
        )

    @property
    def reflectors(self) -> tuple[Reflector, ...]:
        return (self.nodes, self.pods, self.statefulsets)

    def start(self) -> None:
        for reflector in self.reflectors:
            reflector.start()

    def stop(self) -> None:
        """The watches end once their connections do (an API server closing them)."""
        for reflector in self.reflectors:
            reflector.stopped.set()

    def list_once(self) -> None:
        """For `slonk align`: one full list of each kind, no watch."""
        from urllib3.exceptions import HTTPError

        for reflector in self.reflectors:
            try:
                reflector.relist()
            except self._error as err:
                raise KubeError(f"list {reflector.kind}: {err.status} {err.reason}") from err
            except HTTPError as err:
                raise KubeError(f"list {reflector.kind}: {type(err).__name__}: {err}") from err

    @property
    def synced(self) -> bool:
        return all(r.synced for r in self.reflectors)

    def replicas(self) -> dict[str, int]:
        return {
            name: int((sts.get("spec") or {}).get("replicas", 1))
            for name, sts in self.statefulsets.snapshot().items()
        }

    def patch_pod(
        self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> None:
        body = {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}}
        self._call(f"patch pod {name}", self.core.patch_namespaced_pod, name, self.namespace, body)

    def event(self, pod: str, reason: str, message: str) -> None:
        """A core/v1 Event on the worker pod, for `kubectl describe pod` and `get events`."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{pod}.", "namespace": self.namespace},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": self.namespace},
            "reason": reason,
            "message": message[:1024],
            "type": "Normal",
            "source": {"component": "slonk-syncer"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call(f"event on pod {pod}", self.core.create_namespaced_event, self.namespace, body)

    def scale(self, statefulset: str, replicas: int) -> None:
        body = {"spec": {"replicas": replicas}}
        self._call(
            f"scale statefulset {statefulset}",
            self.apps.patch_namespaced_stateful_set_scale,
            statefulset,
            self.namespace,
            body,
        )
