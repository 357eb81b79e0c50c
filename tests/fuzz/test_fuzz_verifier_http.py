"""The verifier's HTTP API (`asyncdapo verifier`, a real server) fuzzed from its own OpenAPI
schema: every generated request is answered within the bound, never with a 5xx other than the
documented 503 (pool busy), with a status code, content type and body the schema documents."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fuzz_budget import BOUND_MS, answered, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from schemathesis.checks import content_type_conformance, not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from asyncdapo.services.verifier.app import create_app
from asyncdapo.services.verifier.settings import VerifierSettings
from asyncdapo.tools.local.local_server import VerifierServer

SURFACE = "verifier_http"


# the schema the service publishes at /openapi.json, taken from the app itself so that the
# strategies exist at collection time; the requests go to a real server
SCHEMA = schemathesis.openapi.from_dict(create_app(VerifierSettings()).openapi())
OPERATIONS = st.one_of([op.ok().as_strategy() for op in SCHEMA.get_all_operations()])
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerifierServer]:
    log = tmp_path_factory.mktemp("verifier") / "verifier.log"
    with VerifierServer(
        workers=2, timeout_s=1.0, extra_args=["--max-items-per-request=16"], log_path=log
    ) as server:
        yield server


@fuzz_settings(1.0)
@given(case=OPERATIONS)
def test_verifier_answers_every_request_in_bound(verifier: VerifierServer, case: schemathesis.Case) -> None:
    with answered(SURFACE, (case.method, case.path, case.body)):
        response = case.call(base_url=verifier.url, timeout=BOUND_MS / 1000)
    assert response.status_code < 500 or response.status_code == 503, (case.method, case.path, response.text)
    if response.status_code == 503:  # documented: the pool is busy or not ready; retry later
        return
    case.validate_response(response, checks=CHECKS)  # raises on a response its schema does not allow
