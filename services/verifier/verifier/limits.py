"""Request limits of the verifier: pure checks returning the violated limit, named as its setting."""

from __future__ import annotations

from dataclasses import dataclass

from asyncdapo.verifier.config import VerifierSettings
from asyncdapo.verifier.schemas import ScoreRequest


@dataclass(frozen=True)
class LimitViolation:
    status_code: int  # 413: the request as a whole is too large; 422: one item's field is
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
    """The first limit `request` violates, or None; item-count first, then items in order."""
    n = len(request.items)
    if n > settings.max_items_per_request:
        return LimitViolation(
            413,
            "max_items_per_request",
            settings.max_items_per_request,
            n,
            f"{n} items exceed max_items_per_request={settings.max_items_per_request}; split the request",
        )
    for index, item in enumerate(request.items):
        for field, text, maximum, limit in (
            ("response", item.response, settings.max_response_bytes, "max_response_bytes"),
            ("ground_truth", item.ground_truth, settings.max_ground_truth_bytes, "max_ground_truth_bytes"),
        ):
            # UTF-8 is at most 4 bytes per character: skip encoding the common, clearly short case.
            if len(text) * 4 > maximum and (size := len(text.encode("utf-8", "surrogatepass"))) > maximum:
                return LimitViolation(
                    422,
                    limit,
                    maximum,
                    size,
                    f"items[{index}].{field} (id {item.id!r}) has {size} bytes, over {limit}={maximum}",
                )
    return None
