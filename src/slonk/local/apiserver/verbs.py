"""The verbs that answer with one object (get, create, update, patch, delete, the scale and
status subresources, evictions) with the API server's rules: a written object is of the URL's
kind, name and namespace; a resourceVersion in it is a precondition; the status subresource
writes only status and the main resource everything else; a Pod's spec is the chart's."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from slonk.local.apiserver import deletion, events, metadata, patches
from slonk.local.apiserver.controllers import Controllers
from slonk.local.apiserver.rbac import Authorizer
from slonk.local.apiserver.resources import Resource
from slonk.local.apiserver.routes import Target, check_name
from slonk.local.apiserver.status import ApiError, invalid
from slonk.local.apiserver.store import Object, Store

# Writes to the main resource leave status alone; the status subresource writes only status.
HAS_STATUS = {"Pod", "Node", "StatefulSet", "PodDisruptionBudget", "Namespace"}


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


def answer(api: Api, verb: str, target: Target, body: Any, content_type: str) -> tuple[int, Object]:
    """The status code and the object a verb on one object answers with."""
    if verb == "patch":
        return patch(api, target, body, content_type)
    done = {"get": get, "create": create, "update": update, "delete": delete}[verb]
    return done(api, target, body)


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


def get(api: Api, target: Target, _: Any) -> tuple[int, Object]:
    obj = api.store.get(target.key, target.namespace, target.name)
    if target.subresource == "scale":
        return 200, scale_of(obj)
    return 200, typed(obj, target.resource)


def create(api: Api, target: Target, body: Any) -> tuple[int, Object]:
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
        meta["name"] = check_name(f"{meta['generateName']}{secrets.token_hex(3)[:5]}")
    if not meta.get("name"):
        raise invalid(
            target.resource.kind,
            "",
            "metadata.name",
            "Required value: name or generateName is required",
        )
    check_name(meta["name"])
    if target.resource.kind == "Event":
        _check_event_namespace(obj, target.namespace)
    if target.resource.namespaced and api.store.find("/namespaces", "", target.namespace) is None:
        raise ApiError(404, f'namespaces "{target.namespace}" not found')
    meta.pop("resourceVersion", None)
    return 201, typed(api.store.create(target.key, obj), target.resource)


def update(api: Api, target: Target, body: Any) -> tuple[int, Object]:
    current = api.store.get(target.key, target.namespace, target.name)
    if target.subresource == "scale":
        if not isinstance(body, dict) or body.get("kind") != "Scale":
            raise ApiError(400, "the scale subresource takes an autoscaling/v1 Scale")
        return _scale(api, target, current, body)
    obj = _checked(body, target)
    return 200, _write(api, target, current, obj)


def patch(api: Api, target: Target, body: Any, content_type: str) -> tuple[int, Object]:
    """Applied to the object as stored, atomically (the API retries a patch that met a
    concurrent write; holding the lock does the same); a resourceVersion in the patch
    is a precondition."""
    kind = content_type.split(";")[0].strip()
    given = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
    with api.store.changed:
        current = api.store.get(target.key, target.namespace, target.name)
        if target.subresource == "scale":
            patched = patches.apply(kind, scale_of(current), body)
            patched.setdefault("metadata", {})["resourceVersion"] = given
            return _scale(api, target, current, patched)
        patched = _checked(patches.apply(kind, typed(current, target.resource), body), target)
        patched["metadata"]["resourceVersion"] = given
        return 200, _write(api, target, current, patched)


def _scale(api: Api, target: Target, current: Object, scale: Object) -> tuple[int, Object]:
    replicas = scale.get("spec", {}).get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        raise invalid("Scale", target.name, "spec.replicas", "must be an integer")
    updated = dict(current, spec={**current["spec"], "replicas": replicas})
    expected = scale.get("metadata", {}).get("resourceVersion")
    updated["metadata"] = {**current["metadata"], "resourceVersion": expected}
    written = _write(api, target, current, updated, main=True)
    return 200, scale_of(written)


def _write(api: Api, target: Target, current: Object, obj: Object, main: bool = False) -> Object:
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
    return typed(written, target.resource)


def delete(api: Api, target: Target, body: Any) -> tuple[int, Object]:
    current = api.store.get(target.key, target.namespace, target.name)
    deletion.check(body, current, target.resource.kind)
    if target.resource.kind == "Pod":
        return 200, typed(api.controllers.delete_pod(target.name), target.resource)
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


def replicas(obj: Object) -> int:
    return int(obj.get("spec", {}).get("replicas", 1))


def typed(obj: Object, resource: Resource) -> Object:
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
