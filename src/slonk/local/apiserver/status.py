"""Errors as the API returns them: a meta/v1 Status with the real code and reason."""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
}


class ApiError(Exception):
    """A request the API refuses: `code` and `message` go into the Status."""

    def __init__(self, code: int, message: str, reason: str = "", **details: Any) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            **({"details": self.details} if self.details else {}),
            "code": self.code,
        }


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    shown = f"{resource}.{group}" if group else resource
    return ApiError(404, f'{shown} "{name}" not found', kind=resource, name=name)


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        kind=resource,
        name=name,
    )


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(
        409, f'{resource} "{name}" already exists', "AlreadyExists", kind=resource, name=name
    )


def invalid(kind: str, name: str, field: str, message: str, group: str = "") -> ApiError:
    """422 with the field in `causes` (kubectl 1.20 prints only those; 1.32 the message)."""
    shown = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        f'{shown} "{name}" is invalid: {field}: {message}',
        kind=kind,
        name=name,
        **({"group": group} if group else {}),
        causes=[{"reason": "FieldValueInvalid", "message": message, "field": field}],
    )
