"""Request limits of the verifier: pure checks returning the violated limit, named as its setting.

Request-level limits live here; the item-level ones are part of the API contract, which the client
checks too (`asyncdapo.contracts.verifier_api.ItemLimits`). Two kinds:
- request-level (`max_request_bytes`, `max_items_per_request`): the request as a whole is refused
  with 413 — splitting it helps;
- item-level (`max_response_bytes`, `max_ground_truth_bytes`): only that item comes back `invalid`,
  the rest of the request is scored. The client checks these before sending (`ItemLimits`), so an
  oversize item never travels.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncdapo.contracts.verifier_api import ItemLimits, ScoreRequest
from asyncdapo.services.verifier.settings import VerifierSettings


@dataclass(frozen=True)
class LimitViolation:
    status_code: int  # 413: the request as a whole is too large
    limit: str  # the setting's name, e.g. "max_items_per_request"
    maximum: int
    actual: int
    message: str

    def body(self) -> dict[str, object]:
        return {"detail": self.message, "limit": self.limit, "maximum": self.maximum, "actual": self.actual}


def check_body_size(content_length: int | None, settings: VerifierSettings) -> LimitViolation | None:
    if content_length is not None and content_length > settings.max_request_bytes:
        return LimitViolation(
            413,
            "max_request_bytes",
            settings.max_request_bytes,
            content_length,
            f"request body of {content_length} bytes exceeds max_request_bytes={settings.max_request_bytes}",
        )
    return None


def check_request(request: ScoreRequest, settings: VerifierSettings) -> LimitViolation | None:
    """The request-level limit `request` violates, or None (item-level limits: `check_items`)."""
    n = len(request.items)
    if n > settings.max_items_per_request:
        return LimitViolation(
            413,
            "max_items_per_request",
            settings.max_items_per_request,
            n,
            f"{n} items exceed max_items_per_request={settings.max_items_per_request}; split the request",
        )
    return None


def item_limits(settings: VerifierSettings) -> ItemLimits:
    """The per-item limits a service with these settings enforces."""
    return ItemLimits(settings.max_response_bytes, settings.max_ground_truth_bytes)
