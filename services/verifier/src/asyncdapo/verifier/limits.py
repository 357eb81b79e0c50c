"""Request limits of the verifier: pure checks returning the violated limit, named as its setting.

Two kinds, shared by the service and its client:
- request-level (`max_request_bytes`, `max_items_per_request`): the request as a whole is refused
  with 413 — splitting it helps;
- item-level (`max_response_bytes`, `max_ground_truth_bytes`): only that item comes back `invalid`,
  the rest of the request is scored. The client checks these before sending (`ItemLimits`), so an
  oversize item never travels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncdapo.verifier.config import VerifierSettings
from asyncdapo.verifier.schemas import ScoreItem, ScoreRequest


@dataclass(frozen=True)
class LimitViolation:
    status_code: int  # 413: the request as a whole is too large
    limit: str  # the setting's name, e.g. "max_items_per_request"
    maximum: int
    actual: int
    message: str

    def body(self) -> dict[str, object]:
        return {"detail": self.message, "limit": self.limit, "maximum": self.maximum, "actual": self.actual}


@dataclass(frozen=True)
class ItemViolation:
    """One item over a per-item limit: it alone is `invalid`, with `message` as its error."""

    limit: str  # "max_response_bytes" | "max_ground_truth_bytes"
    maximum: int
    actual: int
    message: str


@dataclass(frozen=True)
class ItemLimits:
    max_response_bytes: int = VerifierSettings.model_fields["max_response_bytes"].default
    max_ground_truth_bytes: int = VerifierSettings.model_fields["max_ground_truth_bytes"].default

    @classmethod
    def of(cls, settings: VerifierSettings) -> ItemLimits:
        return cls(settings.max_response_bytes, settings.max_ground_truth_bytes)


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


def check_item(item: ScoreItem, limits: ItemLimits) -> ItemViolation | None:
    """The first per-item limit `item` violates (response, then ground truth), or None."""
    for field, text, maximum, limit in (
        ("response", item.response, limits.max_response_bytes, "max_response_bytes"),
        ("ground_truth", item.ground_truth, limits.max_ground_truth_bytes, "max_ground_truth_bytes"),
    ):
        # UTF-8 is at most 4 bytes per character: skip encoding the common, clearly short case.
        if len(text) * 4 > maximum and (size := len(text.encode("utf-8", "surrogatepass"))) > maximum:
            return ItemViolation(
                limit, maximum, size, f"{field} has {size} UTF-8 bytes, over {limit}={maximum}; not scored"
            )
    return None


def check_items(items: Sequence[ScoreItem], limits: ItemLimits) -> dict[int, ItemViolation]:
    """Index → violation for every item over a per-item limit (empty when all are fine)."""
    return {i: v for i, item in enumerate(items) if (v := check_item(item, limits)) is not None}
