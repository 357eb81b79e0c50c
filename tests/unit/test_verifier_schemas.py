"""Verifier request validation, limits, settings, and the verdict → wire-result mapping."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from asyncdapo.contracts.verifier_api import (
    ItemLimits,
    ItemResult,
    ItemStatus,
    ScoreItem,
    ScoreRequest,
    check_item,
    check_items,
)
from asyncdapo.services.verifier.limits import check_body_size, check_request, item_limits
from asyncdapo.services.verifier.protocol import Verdict, decode, encode, result_fields
from asyncdapo.services.verifier.settings import VerifierSettings


def _request(n: int, response: str = "A: 1", ground_truth: str = "1") -> ScoreRequest:
    return ScoreRequest.model_validate(
        {"items": [{"id": f"i{k}", "response": response, "ground_truth": ground_truth} for k in range(n)]}
    )


def test_request_rejects_duplicate_ids_naming_the_item() -> None:
    body = {"items": [{"id": "a", "response": "1", "ground_truth": "1"}] * 2}
    with pytest.raises(ValidationError, match=r"items\[1\]\.id 'a' repeats"):
        ScoreRequest.model_validate(body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"items": []}, "items"),
        ({"items": [{"id": "a", "response": "1"}]}, "ground_truth"),
        ({"items": [{"id": "", "response": "1", "ground_truth": "1"}]}, "id"),
        ({"items": [{"id": "a", "response": "1", "ground_truth": "1", "extra": 1}]}, "extra"),
        ({"items": [{"id": "a", "response": "1", "ground_truth": ""}]}, "ground_truth"),
    ],
)
def test_request_errors_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ScoreRequest.model_validate(body)
    assert field in str(info.value)


def test_item_count_limit_is_413_and_named() -> None:
    settings = VerifierSettings(max_items_per_request=3)
    assert check_request(_request(3), settings) is None
    violation = check_request(_request(4), settings)
    assert violation is not None
    assert (violation.status_code, violation.limit, violation.maximum, violation.actual) == (
        413,
        "max_items_per_request",
        3,
        4,
    )
    assert "max_items_per_request=3" in violation.body()["detail"]


def test_response_bytes_limit_is_per_item_and_names_the_limit() -> None:
    limits = item_limits(VerifierSettings(max_response_bytes=10))
    request = _request(2, response="x" * 10)
    assert check_items(request.items, limits) == {} and check_request(request, VerifierSettings()) is None
    # 4 characters but 12 UTF-8 bytes: the limit is on bytes; only the item over it is named.
    items = [*_request(2).items, ScoreItem(id="big", response="€€€€", ground_truth="1")]
    violations = check_items(items, limits)
    assert list(violations) == [2]
    v = violations[2]
    assert (v.limit, v.maximum, v.actual) == ("max_response_bytes", 10, 12)
    assert "max_response_bytes=10" in v.message and "12 UTF-8 bytes" in v.message


def test_ground_truth_bytes_limit() -> None:
    limits = item_limits(VerifierSettings(max_ground_truth_bytes=10))
    violation = check_item(_request(1, ground_truth="9" * 11).items[0], limits)
    assert violation is not None and violation.limit == "max_ground_truth_bytes"


def test_client_side_limits_default_to_the_service_defaults() -> None:
    assert ItemLimits() == item_limits(VerifierSettings())


def test_body_size_limit() -> None:
    settings = VerifierSettings(max_request_bytes=100)
    assert check_body_size(100, settings) is None
    violation = check_body_size(101, settings)
    assert violation is not None and (violation.status_code, violation.limit) == (413, "max_request_bytes")


def test_settings_from_environment_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDAPO_VERIFIER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("ASYNCDAPO_VERIFIER_WORKERS", "3")
    settings = VerifierSettings()
    assert (settings.timeout_s, settings.workers) == (2.5, 3)
    assert settings.soft_timeout_s == pytest.approx(2.25)
    assert VerifierSettings(cooperative_timeout=False).soft_timeout_s is None
    with pytest.raises(ValidationError, match="timeout_s"):
        VerifierSettings(timeout_s=0)
    with pytest.raises(ValidationError, match="workers"):
        VerifierSettings(workers=0)


def to_result(item_id: str, verdict: Verdict) -> ItemResult:
    # The service writes result_fields as JSON: it must be a valid ItemResult.
    return ItemResult.model_validate(result_fields(item_id, verdict))


def test_ok_verdict_maps_to_score_and_acc() -> None:
    right = to_result("a", Verdict(ItemStatus.OK, acc=True, pred="18"))
    wrong = to_result("b", Verdict(ItemStatus.OK, acc=False, pred=""))
    assert (right.status, right.score, right.acc, right.pred, right.error) == ("ok", 1.0, True, "18", None)
    assert (wrong.status, wrong.score, wrong.acc, wrong.pred) == ("ok", 0.0, False, "")


@pytest.mark.parametrize("status", [ItemStatus.TIMEOUT, ItemStatus.ERROR, ItemStatus.INVALID])
def test_failures_never_carry_a_score(status: ItemStatus) -> None:
    result = to_result("a", Verdict(status, error="why"))
    assert result.status is status
    assert result.score is None and result.acc is None and result.pred is None
    assert result.error == "why"
    assert result.model_dump(mode="json")["status"] == status.value


def test_ok_verdict_without_acc_is_a_bug() -> None:
    with pytest.raises(ValueError, match="must carry acc"):
        result_fields("a", Verdict(ItemStatus.OK))


@pytest.mark.parametrize(
    "verdict",
    [
        Verdict(ItemStatus.OK, True, "18"),
        Verdict(ItemStatus.TIMEOUT, error="slow"),
        Verdict(ItemStatus.ERROR),
    ],
)
def test_worker_records_round_trip(verdict: Verdict) -> None:
    record = encode(7, verdict, 0.25)
    assert all(type(v) in (int, str, bool, float, type(None)) for v in record)  # cheap to pickle
    assert decode(record) == (7, verdict, 0.25)


def test_spare_workers_follow_workers_not_the_machine() -> None:
    assert [VerifierSettings(workers=w).spare_workers for w in (1, 8, 9, 64)] == [1, 1, 2, 8]
    assert VerifierSettings(workers=2, spare_workers=0).spare_workers == 0
