"""On CPU, a gateway's vLLM engine never chunks a prefill (vllm_engine.VllmSettings.engine_args):
vLLM 0.32's CPU worker dies when it chunks a seeded request's prefill ("CPU Generator does not use
offset"), and every rollout request is seeded."""

from __future__ import annotations

from asyncdapo.services.gateway.vllm_engine import VllmSettings


def test_the_step_budget_holds_every_slots_whole_context_on_cpu() -> None:
    args = VllmSettings(model="m", max_concurrency=96, max_model_len=576).engine_args()
    assert args.max_num_batched_tokens == 96 * 576  # the long-tail bench's burst: 96 new requests
    small = VllmSettings(model="m", max_concurrency=4, max_model_len=100).engine_args()
    assert small.max_num_batched_tokens == 2048  # never below vLLM's default
    override = VllmSettings(model="m", max_model_len=100, extra={"max_num_batched_tokens": 4096})
    assert override.engine_args().max_num_batched_tokens == 4096  # --engine-arg still wins
