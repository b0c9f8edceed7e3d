"""A list in pages, as the API server serves `limit` and `continue`: items in the order of
their namespace and name, at most `limit` of them, and a token naming where the next page
starts, with how many items remain (not counted for a list with a selector, as the real
server). The real server reads each further page from the first page's snapshot; the fake
keeps no snapshot, so a token from before a change to that kind is expired (410), as the real
server's is once compacted: a client must then list again from the start (client-go's pager
does so by itself, kubectl does not)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any

from slonk.local.apiserver.status import ApiError
from slonk.local.apiserver.store import Object

EXPIRED = (
    "the provided continue parameter is too old to display a consistent list result "
    "(the fake API server keeps no snapshot: a change to the kind expires it); list again "
    "without it"
)


def _key(item: Object) -> tuple[str, str]:
    meta = item["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _token(rv: int, after: tuple[str, str]) -> str:
    raw = json.dumps({"rv": rv, "after": list(after)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _start(token: str, changed_after: Callable[[int], bool]) -> tuple[str, str]:
    try:
        found = json.loads(base64.urlsafe_b64decode(token.encode()))
        at, after = int(found["rv"]), tuple(str(part) for part in found["after"])
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise ApiError(400, f"continue key is not valid: {token!a}") from None
    if len(after) != 2:
        raise ApiError(400, f"continue key is not valid: {token!a}")
    if changed_after(at):
        raise ApiError(410, EXPIRED, "Expired")
    return after[0], after[1]


def page(
    items: list[Object],
    rv: int,
    query: Mapping[str, str],
    changed_after: Callable[[int], bool],
    counted: bool = True,
) -> tuple[list[Object], Any]:
    """The items of the page `query` asks for, and the list's metadata beyond its
    resourceVersion ({} for a list that was not paged, or its last page). `items` are the
    kind's as of `rv`; `changed_after(rv)` tells whether the kind changed since a token's rv;
    `counted`: whether to say how many items remain (False for a list with a selector)."""
    text = query.get("limit", "")
    try:
        limit = int(text) if text else 0
    except ValueError:
        raise ApiError(400, f"limit must be an integer, not {text!a}") from None
    if limit < 0:
        raise ApiError(400, f"limit must not be negative, got {limit}")
    items = sorted(items, key=_key)
    if query.get("continue"):
        after = _start(query["continue"], changed_after)
        items = [item for item in items if _key(item) > after]
    if not limit or len(items) <= limit:
        return items, {}
    shown = items[:limit]
    more: dict[str, Any] = {"continue": _token(rv, _key(shown[-1]))}
    if counted:
        more["remainingItemCount"] = len(items) - limit
    return shown, more
