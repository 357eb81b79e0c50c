"""The real verifier service (`asyncdapo verifier` in a child process, 2 workers) over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncdapo.contracts.verifier_api import ScoreItem
from asyncdapo.runtime.verifier_client import VerifierClient
from asyncdapo.tools.local.local_server import VerifierServer
from asyncdapo.tools.local.ports import wait_until

TIMEOUT_S = 2.0
NESTED_FRAC = "The answer is $\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}$"
LIMIT_ARGS = ["--max-items-per-request=64", "--max-response-bytes=65536", "--spare-workers=1"]
PROCESSES = 3  # 2 workers + 1 spare


def _server(tmp_path_factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[VerifierServer]:
    log = Path(tmp_path_factory.mktemp(name)) / "verifier.log"
    with VerifierServer(
        workers=2, timeout_s=TIMEOUT_S, extra_args=[*LIMIT_ARGS, *args], log_path=log
    ) as server:
        yield server


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerifierServer]:
    """Default knobs: the in-worker alarm ends interruptible stalls without a restart."""
    yield from _server(tmp_path_factory, "verifier")


@pytest.fixture(scope="module")
def killing_verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerifierServer]:
    """No in-worker alarm: every timeout is enforced by killing and replacing the worker."""
    yield from _server(tmp_path_factory, "verifier-kill", "--no-cooperative-timeout")


def _item(item_id: str, response: str, ground_truth: str) -> dict[str, str]:
    return {"id": item_id, "response": response, "ground_truth": ground_truth}


def _metric(url: str, sample_name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(f"{sample_name}{labels} not in /metrics")


def test_scores_correct_wrong_boxed_and_garbage(verifier: VerifierServer) -> None:
    items = [
        _item("correct", "She makes 9 * 2 = $<<9*2=18>>18 every day.\nA: 18", "18"),
        _item("wrong", "So she has 13 eggs.\nA: 26", "18"),
        _item("boxed", "Hence $x = \\boxed{\\frac{3}{4}}$.", "0.75"),
        _item("boxed-wrong", "Hence $\\boxed{\\sqrt{2}}$.", "2"),
        _item("garbage", "}}{{ \\left( ??? \x00 ¯\\_(ツ)_/¯", "5"),
        _item("bad-gold", "A: 5", "no number here"),
    ]
    response = httpx.post(f"{verifier.url}/v1/score", json={"items": items}, timeout=30)
    assert response.status_code == 200
    got = {r["id"]: r for r in response.json()["results"]}
    assert list(got) == [it["id"] for it in items]
    assert got["correct"] | {"error": None} == {
        "id": "correct",
        "status": "ok",
        "score": 1.0,
        "acc": True,
        "pred": "18",
        "error": None,
    }
    assert (got["wrong"]["status"], got["wrong"]["score"], got["wrong"]["pred"]) == ("ok", 0.0, "26")
    assert (got["boxed"]["acc"], got["boxed"]["pred"]) == (True, "\\frac{3}{4}")
    assert (got["boxed-wrong"]["status"], got["boxed-wrong"]["acc"]) == ("ok", False)
    # Nothing parsable in the response, parsing finished: a wrong answer, not a failure.
    assert (got["garbage"]["status"], got["garbage"]["score"], got["garbage"]["pred"]) == ("ok", 0.0, "")
    # A ground truth math-verify cannot parse is the data's fault: error, and no score.
    assert got["bad-gold"]["status"] == "error" and got["bad-gold"]["score"] is None
    assert "ground_truth" in got["bad-gold"]["error"]


async def test_typed_client_against_the_service(verifier: VerifierServer) -> None:
    items = [ScoreItem(id=str(k), response=f"A: {k}", ground_truth=str(k % 3)) for k in range(40)]
    async with VerifierClient(verifier.url, batch_size=16) as client:
        assert await client.ready()
        results = await client.score(items)
    assert [r.id for r in results] == [it.id for it in items]
    assert [r.acc for r in results] == [k == k % 3 for k in range(40)]


def test_limits_name_the_limit_and_an_oversize_item_fails_alone(verifier: VerifierServer) -> None:
    url = f"{verifier.url}/v1/score"
    too_many = {"items": [_item(str(k), "A: 1", "1") for k in range(65)]}
    r = httpx.post(url, json=too_many)
    assert r.status_code == 413
    assert r.json()["limit"] == "max_items_per_request" and "max_items_per_request=64" in r.json()["detail"]

    # An item over a per-item limit fails alone (`invalid`, naming the limit); the others are scored.
    too_long = {
        "items": [_item("a", "A: 1", "1"), _item("b", "9" * 65537, "1"), _item("c", "A: 2", "1" * 4097)]
        + [_item(f"ok{k}", f"A: {k}", "3") for k in range(5)]
    }
    r = httpx.post(url, json=too_long)
    assert r.status_code == 200
    got = {res["id"]: res for res in r.json()["results"]}
    assert list(got) == [it["id"] for it in too_long["items"]]
    assert got["b"]["status"] == "invalid" and got["b"]["score"] is None
    assert "max_response_bytes=65536" in got["b"]["error"] and "65537" in got["b"]["error"]
    assert got["c"]["status"] == "invalid" and "max_ground_truth_bytes=4096" in got["c"]["error"]
    assert (got["a"]["status"], got["a"]["acc"]) == ("ok", True)
    assert [got[f"ok{k}"]["acc"] for k in range(5)] == [k == 3 for k in range(5)]
    assert _metric(verifier.url, "asyncdapo_verifier_items_total", status="invalid") >= 2

    r = httpx.post(url, json={"items": [{"id": "a", "response": "A: 1"}]})
    assert r.status_code == 422 and "ground_truth" in r.text

    r = httpx.post(url, content=iter([b'{"items": []}']), headers={"content-type": "application/json"})
    assert r.status_code == 411 and "Content-Length" in r.json()["detail"]


def test_health_readiness_metrics_and_docs(verifier: VerifierServer) -> None:
    assert httpx.get(f"{verifier.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{verifier.url}/readyz")
    assert ready.status_code == 200 and ready.json() == {
        "ready": True,
        "workers_ready": PROCESSES,
        "workers": 2,
        "spare_workers": 1,
    }
    httpx.post(f"{verifier.url}/v1/score", json={"items": [_item("m", "A: 1", "1")]})
    assert _metric(verifier.url, "asyncdapo_verifier_requests_total", code="200") >= 1
    assert _metric(verifier.url, "asyncdapo_verifier_items_total", status="ok") >= 1
    assert _metric(verifier.url, "asyncdapo_verifier_request_seconds_count") >= 1
    assert _metric(verifier.url, "asyncdapo_verifier_item_seconds_count") >= 1
    assert _metric(verifier.url, "asyncdapo_verifier_worker_restarts_total", reason="timeout") >= 0
    assert _metric(verifier.url, "asyncdapo_verifier_workers_ready") == PROCESSES
    assert _metric(verifier.url, "asyncdapo_verifier_stalled_items_total") >= 0
    openapi = httpx.get(f"{verifier.url}/openapi.json").json()
    assert {"/v1/score", "/healthz", "/readyz", "/metrics"} <= set(openapi["paths"])
    assert httpx.get(f"{verifier.url}/docs").status_code == 200


@pytest.mark.parametrize("mode", ["in-worker alarm", "worker killed"])
async def test_pathological_item_times_out_while_others_are_scored(
    mode: str, request: pytest.FixtureRequest
) -> None:
    server: VerifierServer = request.getfixturevalue(
        "verifier" if mode == "in-worker alarm" else "killing_verifier"
    )
    restarts_before = _metric(server.url, "asyncdapo_verifier_worker_restarts_total", reason="timeout")
    batch = [
        _item("stuck", NESTED_FRAC, "2"),
        _item("right", "A: 18", "18"),
        _item("wrong", "A: 17", "18"),
        _item("boxed", "$\\boxed{0.5}$", "\\frac{1}{2}"),
    ]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:

        async def post(items: list[dict[str, str]], delay_s: float = 0.0) -> tuple[float, httpx.Response]:
            await asyncio.sleep(delay_s)
            t0 = time.monotonic()
            response = await http.post("/v1/score", json={"items": items})
            return time.monotonic() - t0, response

        (batch_s, batch_r), (other_s, other_r) = await asyncio.gather(
            post(batch), post([_item(f"c{k}", f"A: {k}", "3") for k in range(6)], delay_s=0.3)
        )
        after_s, after_r = await post([_item("after", "A: 42", "42")])

    got = {r["id"]: r for r in batch_r.json()["results"]}
    assert got["stuck"]["status"] == "timeout" and got["stuck"]["score"] is None
    assert batch_s <= TIMEOUT_S + 1.0, f"timeout took {batch_s:.2f} s"
    assert [(got[k]["status"], got[k]["acc"]) for k in ("right", "wrong", "boxed")] == [
        ("ok", True),
        ("ok", False),
        ("ok", True),
    ]
    # The concurrent request is served by the other worker while one is stuck.
    assert other_s < TIMEOUT_S, f"concurrent request took {other_s:.2f} s"
    assert [r["acc"] for r in other_r.json()["results"]] == [k == 3 for k in range(6)]
    assert after_r.json()["results"][0]["acc"] is True
    print(
        f"\n[{mode}] pathological batch answered in {batch_s:.2f} s (timeout {TIMEOUT_S} s); "
        f"concurrent request {other_s * 1000:.0f} ms; next request {after_s * 1000:.0f} ms"
    )

    restarts = (
        _metric(server.url, "asyncdapo_verifier_worker_restarts_total", reason="timeout") - restarts_before
    )
    if mode == "worker killed":
        assert restarts == 1
        assert "worker process killed" in got["stuck"]["error"]
        # The replacement warms up and the pool is back at full strength.
        wait_until(
            lambda: _metric(server.url, "asyncdapo_verifier_workers_ready") == PROCESSES,
            30,
            "replacement worker",
        )
    else:
        assert restarts == 0
        assert "in-worker alarm" in got["stuck"]["error"]
    assert _metric(server.url, "asyncdapo_verifier_items_total", status="timeout") >= 1
