"""Wire schemas of `POST /v1/score`, shared by the service and its client.

Invariants (checked by the service, relied on by the client):
- `results` has exactly one entry per request item, in request order, with the same `id`.
- `status == ok`  ⇔ `score` and `acc` are set (`score == 1.0` ⇔ `acc`); `pred` is the extracted answer
  ("" when the response holds no parsable answer, a legitimate wrong answer).
- `status in (timeout, error, invalid)` ⇒ `score`, `acc` are null and `error` says why; a failure is
  never reported as a zero score.
- `invalid`: the item alone breaks a per-item limit (`max_response_bytes`, `max_ground_truth_bytes`;
  `error` names the limit); it was not scored, the rest of the request was (HTTP 200). Retrying the
  same item cannot help. Request-level limits (item count, body size) are a 413 for the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ItemStatus(StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"
    INVALID = "invalid"


class ScoreItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=256, description="Caller's id, echoed in the result.")
    response: str = Field(description="The model's full response; the answer is extracted from it.")
    ground_truth: str = Field(min_length=1, description="Reference answer, e.g. `18` or `\\frac{1}{2}`.")


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[ScoreItem] = Field(min_length=1, description="Items to score; ids must be unique.")

    @field_validator("items")
    @classmethod
    def _unique_ids(cls, items: list[ScoreItem]) -> list[ScoreItem]:
        seen: set[str] = set()
        for index, item in enumerate(items):
            if item.id in seen:
                raise ValueError(f"items[{index}].id {item.id!r} repeats an earlier id; ids must be unique")
            seen.add(item.id)
        return items


class ItemResult(BaseModel):
    id: str
    status: ItemStatus
    score: float | None = Field(default=None, description="1.0 if correct, 0.0 if not; null unless ok.")
    acc: bool | None = Field(default=None, description="Correctness; null unless ok.")
    pred: str | None = Field(default=None, description="Extracted answer (truncated); null unless ok.")
    error: str | None = Field(default=None, description="Why the item is not ok.")


class ScoreResponse(BaseModel):
    results: list[ItemResult]


# Item-level limits: an item over one comes back `invalid` alone. Part of the contract because the
# client checks them before sending, so an oversize item never travels.
MAX_RESPONSE_BYTES = 131072
MAX_GROUND_TRUTH_BYTES = 4096


@dataclass(frozen=True)
class ItemViolation:
    """One item over a per-item limit: it alone is `invalid`, with `message` as its error."""

    limit: str  # "max_response_bytes" | "max_ground_truth_bytes"
    maximum: int
    actual: int
    message: str


@dataclass(frozen=True)
class ItemLimits:
    """Per-item limits; the defaults are the service's (its settings take them from here)."""

    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_ground_truth_bytes: int = MAX_GROUND_TRUTH_BYTES


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
