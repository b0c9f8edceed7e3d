"""Objects in memory, each kind keyed by namespace and name, with one resourceVersion counter
for all of them (as etcd's revision) and the recent changes kept for watches."""

from __future__ import annotations

import builtins
import copy
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slonk.local.apiserver.status import ApiError, already_exists, conflict, not_found

HISTORY = 2000  # changes kept for watches; a watch from before them gets 410 Gone

Object = dict[str, Any]


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Change:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str  # "<group>/<plural>", the core group as ""
    object: Object
    old: Object | None = None  # before a MODIFIED: a watch with a selector needs both


class Store:
    def __init__(
        self, history: int = HISTORY, on_change: Callable[[Change], None] | None = None
    ) -> None:
        self.on_change = on_change  # called with the lock held, e.g. to keep a file current
        self.changed = threading.Condition()
        self.rv = 0
        self._objects: dict[str, dict[tuple[str, str], Object]] = {}
        self._history: deque[Change] = deque(maxlen=history)
        self._last_change: dict[str, int] = {}  # each kind's latest resourceVersion
        self.compacted = 0  # changes up to here are gone from the history

    def _record(
        self, change_type: str, resource: str, obj: Object, old: Object | None = None
    ) -> None:
        if len(self._history) == self._history.maxlen:
            self.compacted = self._history[0].rv
        change = Change(self.rv, change_type, resource, copy.deepcopy(obj), old)
        self._last_change[resource] = self.rv
        self._history.append(change)
        if self.on_change:
            self.on_change(change)
        self.changed.notify_all()

    def _next(self, obj: Object) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def get(self, resource: str, namespace: str, name: str) -> Object:
        with self.changed:
            found = self._objects.get(resource, {}).get((namespace, name))
            if found is None:
                raise not_found(resource.rpartition("/")[2], name, resource.partition("/")[0])
            return copy.deepcopy(found)

    def find(self, resource: str, namespace: str, name: str) -> Object | None:
        with self.changed:
            found = self._objects.get(resource, {}).get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def list(self, resource: str, namespace: str | None = None) -> tuple[list[Object], int]:
        """The objects (of one namespace, or all) and the resourceVersion they are as of."""
        with self.changed:
            items = [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._objects.get(resource, {}).items())
                if namespace in (None, ns)
            ]
            return items, self.rv

    def create(self, resource: str, obj: Object) -> Object:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        with self.changed:
            kept = self._objects.setdefault(resource, {})
            if key in kept:
                raise already_exists(resource.rpartition("/")[2], meta["name"])
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta.setdefault("generation", 1)
            meta.pop("deletionTimestamp", None)
            self._next(obj)
            kept[key] = obj
            self._record("ADDED", resource, obj)
            return copy.deepcopy(obj)

    def update(
        self, resource: str, obj: Object, expected: str | None = None, system: bool = False
    ) -> Object:
        """Replace an object; `expected`: the resourceVersion the writer read (409 if it moved
        on since). uid, creationTimestamp and (but for the `system`'s own writes)
        deletionTimestamp stay the server's."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        name = meta["name"]
        key = (meta.get("namespace", ""), name)
        plural = resource.rpartition("/")[2]
        with self.changed:
            current = self._objects.get(resource, {}).get(key)
            if current is None:
                raise not_found(plural, name, resource.partition("/")[0])
            was = current["metadata"]
            if expected and expected != was["resourceVersion"]:
                raise conflict(
                    plural,
                    name,
                    "the object has been modified; please apply your changes to "
                    "the latest version and try again",
                )
            if meta.get("uid") not in (None, was["uid"]):
                raise conflict(
                    plural,
                    name,
                    f"Precondition failed: UID in precondition: "
                    f"{meta['uid']}, UID in object meta: {was['uid']}",
                )
            kept = (
                "uid",
                "creationTimestamp",
                "generation",
                *(() if system else ("deletionTimestamp", "deletionGracePeriodSeconds")),
            )
            for field in kept:
                if field in was:
                    meta[field] = was[field]
                else:
                    meta.pop(field, None)
            if obj.get("spec") != current.get("spec"):
                meta["generation"] = int(was.get("generation", 1)) + 1
            if _same(obj, current):
                return copy.deepcopy(current)  # a no-op write keeps the resourceVersion
            self._next(obj)
            self._objects[resource][key] = obj
            self._record("MODIFIED", resource, obj, copy.deepcopy(current))
            return copy.deepcopy(obj)

    def modify(
        self, resource: str, namespace: str, name: str, change: Callable[[Object], None]
    ) -> Object | None:
        """Change an object in place, atomically (a controller's write); None if it is gone."""
        with self.changed:
            current = self.find(resource, namespace, name)
            if current is None:
                return None
            change(current)
            return self.update(resource, current, system=True)

    def delete(self, resource: str, namespace: str, name: str) -> Object:
        with self.changed:
            current = self._objects.get(resource, {}).pop((namespace, name), None)
            if current is None:
                raise not_found(resource.rpartition("/")[2], name, resource.partition("/")[0])
            self._next(current)
            self._record("DELETED", resource, current)
            return copy.deepcopy(current)

    def changed_after(self, resource: str, rv: int) -> bool:
        """Whether any object of `resource` changed after resourceVersion `rv`."""
        with self.changed:
            return self._last_change.get(resource, 0) > rv

    def changes(self, resource: str, since: int) -> tuple[builtins.list[Change], int]:
        """The changes to `resource` after resourceVersion `since`, and the resourceVersion
        they bring a watcher to; 410 once they are no longer all kept."""
        with self.changed:
            if since < self.compacted:
                raise ApiError(
                    410, f"too old resource version: {since} ({self.compacted + 1})", "Expired"
                )
            return [c for c in self._history if c.rv > since and c.resource == resource], self.rv


def _same(a: Object, b: Object) -> bool:
    def strip(o: Object) -> Object:
        return {**o, "metadata": {**o["metadata"], "resourceVersion": None}}

    return strip(a) == strip(b)
