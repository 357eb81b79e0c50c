"""The rollout core driven by plain events — no Redis, no gateways, no event loop: the in-memory
store (`memstore`, the Lua semantics, checked equal to Redis by test_scheduler_store_equivalence)
and a hand that finishes requests in the order a test chooses. Every commit rule the integration
tests check against sim gateways and Redis, checked here exactly and in milliseconds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.prompts import PromptRecord
from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, rollout_pb2
from asyncdapo.services.scheduler.core import (
    Abort,
    Command,
    Dispatch,
    NullObserver,
    Phase,
    Redispatch,
    RolloutCore,
    ScoreResponse,
)
from asyncdapo.services.scheduler.memstore import MemoryGroupStore, MemoryQueue, MemoryRun
from asyncdapo.services.scheduler.outcome_records import DropReason, RequeueReason
from asyncdapo.services.scheduler.policy.long_tail import LongTailAction
from asyncdapo.services.scheduler.tasks import Kind, PromptTask, Request


def cfg_of(**over: Any) -> RunConfig:
    base: dict[str, Any] = {
        "name": "core",
        "data": {"train_batch_size": 2, "max_response_length": 64, "max_prompt_length": 16},
        "reward": {"overlong_buffer": {"len": 16}},
        "rollout": {"n": 2, "max_concurrent_prompts": 6, "admission": {"policy": "greedy"}},
        "trainer": {"ppo_mini_batch_size": 2},
    }
    for section, values in over.items():
        base.setdefault(section, {}).update(values)
    return RunConfig.model_validate(base)


@dataclass
class Hand:
    """Drives a RolloutCore on the in-memory store, synchronously."""

    cfg: RunConfig
    run: MemoryRun = field(default_factory=MemoryRun)
    pools: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.core = RolloutCore(self.cfg, pool_exists=lambda label: label in self.pools)
        self.store = MemoryGroupStore(self.run, self.cfg.data.train_batch_size, self.cfg.staleness_window)
        self.queue = MemoryQueue(self.run, "s1")
        self.queue.store = self.store
        self.queue.take_over()
        self.running: dict[str, Request] = {}  # request id -> live request on a "gateway"
        self.aborted: list[str] = []
        self.to_score: list[ScoreResponse] = []

    def push(self, rules: list[str]) -> list[str]:
        """Queue one prompt per rule; the ground truth names the rule the scores follow."""
        start = len(self.run.data)
        recs = [
            PromptRecord(f"e0-{start + i}", [1, 2, 3], "q", r, "t", 0, start + i) for i, r in enumerate(rules)
        ]
        self.run.push(recs)
        return [r.id for r in recs]

    def do(self, commands: list[Command]) -> None:
        for c in commands:
            if isinstance(c, Dispatch):
                for r in c.requests:
                    self.running[r.make_rid()] = r
            elif isinstance(c, Redispatch):
                c.request.tries += 1
                self.running[c.request.make_rid()] = c.request
            elif isinstance(c, Abort):
                for t in c.tasks:
                    for rid, r in list(self.running.items()):
                        if r.task is t:
                            del self.running[rid]
                            self.aborted.append(rid)
            elif isinstance(c, ScoreResponse):
                self.to_score.append(c)

    def admit(self, limit: int = 64) -> int:
        k = self.core.admissible(limit)
        if not k:
            return 0
        batch = self.queue.claim(k, self.cfg.rollout.n)
        self.core.admitted_seen = max(self.core.admitted_seen, batch.admitted_total)
        self.do(self.core.claimed(batch.claims, self.queue.load([c.pid for c in batch.claims])))
        return len(batch.claims)

    def complete(self, rid: str, tokens: int, version: int | None = None) -> None:
        """The gateway finished request `rid` with `tokens` tokens (of `version`)."""
        req = self.running.pop(rid)
        v = self.core.version if version is None else version
        resp = gateway_pb2.GenerateResponse(
            request_id=rid,
            token_ids=[5] * tokens,
            logprobs=[-0.5] * tokens,
            finish_reason=common_pb2.FINISH_REASON_LENGTH
            if tokens >= (req.max_tokens or 64)
            else common_pb2.FINISH_REASON_STOP,
            version_runs=[common_pb2.VersionRun(version=v, num_tokens=tokens)],
        )
        req.task.live.pop(req.idx, None)
        self.do(self.core.response(req, "gw0", resp))

    def score_all(self) -> None:
        """The verifier judged everything sent: `mixed` right iff the index is even, `all1`/`all0`."""
        jobs, self.to_score = self.to_score, []
        scored = []
        for j in jobs:
            rule = j.ground_truth
            acc = {"mixed": float(j.idx % 2 == 0), "all1": 1.0, "all0": 0.0}[rule]
            scored.append((j.task, j.idx, acc, str(int(acc))))
        scores = self.core.scores_to_record(scored)
        owners = [self.core.tasks[(s.pid, s.attempt)] for s in scores]
        assert self.core.recorded(owners, scores, self.store.record(scores))

    def finish(self) -> None:
        """Finisher rounds until nothing is left to write."""
        for _ in range(20):
            batch, cmds = self.core.next_finish_batch(self.store.finish_call)
            self.do(cmds)
            if not batch:
                return
            _, cmds = self.core.finish_applied(batch, self.store.finish_many([i for _, i in batch]))
            self.do(cmds)
        raise AssertionError("the finisher never settled")

    def finish_all_running(self, tokens: int = 8) -> None:
        for rid in sorted(self.running):
            if rid in self.running:
                self.complete(rid, tokens)
        self.score_all()
        self.finish()

    def ledger(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pid, a, label, _ in self.run.outcomes:
            out.setdefault(pid, []).append(label)
            assert len(out[pid]) == a, f"{pid}: attempt {a} recorded out of order"
        return out

    def groups(self) -> list[rollout_pb2.Group]:
        return [rollout_pb2.Group.FromString(g) for _, g in self.run.groups]


def test_exactly_b_valid_per_version_the_rest_aborted_and_requeued() -> None:
    h = Hand(cfg_of())
    ids = h.push(["mixed", "all0", "mixed", "mixed", "all1", "mixed"])
    h.core.start()
    assert h.admit() == 6
    by_task = {
        r.task.pid: [rid for rid, x in h.running.items() if x.task is r.task] for r in h.running.values()
    }
    for pid in ("e0-0", "e0-1", "e0-2"):  # two valid groups and one filtered finish first
        for rid in by_task[pid]:
            h.complete(rid, 8)
    h.score_all()
    h.finish()
    assert h.core.phase == Phase.BOUND and h.core.valid_produced == 2
    # the rest was aborted at the bound and requeued at the head, earliest admitted first
    assert sorted(h.aborted) == sorted(rid for pid in ("e0-3", "e0-4", "e0-5") for rid in by_task[pid])
    assert list(h.run.queue) == ["e0-3", "e0-4", "e0-5"] and not h.core.tasks
    assert h.ledger() == {
        "e0-0": ["valid"], "e0-1": ["filtered"], "e0-2": ["valid"],
        "e0-3": ["requeued:early_stop"], "e0-4": ["requeued:early_stop"], "e0-5": ["requeued:early_stop"],
    }  # fmt: skip
    assert h.core.admissible() == 0
    # a publish raises the bound: admission resumes with the requeued prompts first
    h.core.weights_published(1, "/w/v1")
    assert h.core.phase == Phase.ROLLING and h.admit() == 3
    assert {r.task.pid for r in h.running.values()} == {"e0-3", "e0-4", "e0-5"}
    assert all(r.task.attempt == 2 for r in h.running.values())
    assert [g.prompt_id for g in h.groups()] == ["e0-0", "e0-2"] and ids


def test_fifo_commits_in_admission_order_and_aborts_only_later_prompts() -> None:
    h = Hand(cfg_of(rollout={"early_stop_order": "fifo"}))
    h.push(["mixed"] * 4)
    h.core.start()
    h.admit()
    rids = {
        pid: sorted(rid for rid, r in h.running.items() if r.task.pid == pid)
        for pid in ("e0-0", "e0-1", "e0-2", "e0-3")
    }
    for pid in ("e0-1", "e0-2"):  # later prompts finish first
        for rid in rids[pid]:
            h.complete(rid, 8)
    h.score_all()
    h.finish()
    # ready groups at admission positions 2 and 3 cover B = 2 counting e0-0 still running before
    # them: e0-3 (after the cut-off) is aborted; nothing commits while e0-0, admitted first, runs
    assert h.core.valid_produced == 0 and h.ledger() == {"e0-3": ["requeued:early_stop"]}
    for rid in rids["e0-0"]:
        h.complete(rid, 8)
    h.score_all()
    h.finish()
    # the first B valid groups in admission order are trained; the one beyond goes back
    assert [g.prompt_id for g in h.groups()] == ["e0-0", "e0-1"] and h.core.phase == Phase.BOUND
    assert h.ledger()["e0-2"] == ["requeued:over_bound"]


def test_sync_commits_only_once_the_whole_batch_is_done_and_never_aborts() -> None:
    h = Hand(cfg_of(rollout={"mode": "sync", "max_concurrent_prompts": 4}))
    h.push(["mixed"] * 8)
    h.core.start()
    assert h.admit() == 4 and h.admit() == 0  # one generation batch at a time
    rids = sorted(h.running)
    for rid in rids[:-1]:
        h.complete(rid, 8)
    h.score_all()
    h.finish()
    assert h.core.valid_produced == 0 and not h.aborted  # the batch still runs: nothing committed
    h.complete(rids[-1], 8)
    h.score_all()
    h.finish()
    led = h.ledger()
    assert h.core.valid_produced == 2 and not h.aborted
    # verl's loop keeps the first B valid groups of the batch; the rest is spent for the epoch
    assert sorted(led.values()) == [["dropped:surplus"]] * 2 + [["valid"]] * 2
    assert not h.run.queue or set(h.run.queue).isdisjoint(led)


def test_sync_stops_after_max_num_gen_batches_without_b_valid_groups() -> None:
    h = Hand(cfg_of(rollout={"mode": "sync", "max_concurrent_prompts": 2, "max_num_gen_batches": 2}))
    h.push(["all0"] * 8)  # never any variance
    h.core.start()
    for _ in range(2):
        assert h.admit() == 2
        h.finish_all_running()
    assert h.core.phase == Phase.STOPPED and h.admit() == 0
    assert "max_num_gen_batches=2" in h.core.failure
    # a new step (weights published) would start counting again
    h.core.weights_published(1, "/w/v1")
    assert h.core.counts.gen_batches == 0


def test_a_group_the_consuming_step_finds_stale_is_requeued_with_its_own_reason() -> None:
    h = Hand(cfg_of(rollout={"max_staleness": 1}))
    h.push(["mixed"] * 6)
    h.core.start()
    h.admit()
    h.core.weights_published(1, "/w/v1")
    h.core.weights_published(2, "/w/v2")
    h.store.version = 2
    for rid in sorted(h.running):  # tokens of version 0, two versions ago
        h.complete(rid, 8, version=0)
    h.score_all()
    h.finish()
    assert h.core.valid_produced == 0
    assert {lbl for v in h.ledger().values() for lbl in v} == {"requeued:stale"}


def test_credits_from_the_trainer_reopen_the_bound() -> None:
    h = Hand(cfg_of())
    h.push(["mixed"] * 6)
    h.core.start()
    h.admit(2)
    h.finish_all_running()
    assert h.core.phase == Phase.BOUND and h.core.admissible() == 0
    h.run.incr("valid_credited", 1)  # the trainer dropped one (say malformed) and credited it
    assert h.core.credits_read(h.run.counters["valid_produced"], h.run.counters["valid_credited"])
    assert h.core.phase == Phase.ROLLING and h.core.admissible() > 0


def test_bad_and_too_long_prompts_and_give_ups_are_dropped_with_their_reason() -> None:
    h = Hand(cfg_of())
    h.run.data["e0-0"] = PromptRecord("e0-0", [1] * 40, "q", "mixed", "t", 0, 0)  # over max_prompt_length
    h.run.queue.append("e0-0")
    h.run.queue.append("missing")  # no data
    h.push(["mixed"])
    h.core.start()
    h.admit()
    h.finish()
    (rid,) = [rid for rid, r in h.running.items() if r.idx == 0]
    req = h.running[rid]
    h.do(h.core.fail(req.task, DropReason.GATEWAY_ERROR, "failed on every gateway"))
    h.finish()
    assert h.ledger() == {
        "e0-0": ["dropped:prompt_too_long"], "missing": ["dropped:bad_prompt"], "e0-1": ["dropped:gateway_error"],
    }  # fmt: skip
    assert not h.core.tasks and not h.run.claimed


def test_stop_with_abort_requeues_everything_in_flight() -> None:
    h = Hand(cfg_of())
    h.push(["mixed"] * 3)
    h.core.start()
    h.admit()
    h.do(h.core.stop(abort_in_flight=True, reason=RequeueReason.SHUTDOWN))
    h.finish()
    assert h.core.phase == Phase.STOPPED and not h.core.tasks
    assert {lbl for v in h.ledger().values() for lbl in v} == {"requeued:shutdown"}
    assert list(h.run.queue) == ["e0-0", "e0-1", "e0-2"]


def test_a_failed_write_is_resent_as_is_and_a_lost_reply_applied_once() -> None:
    h = Hand(cfg_of())
    h.push(["mixed", "all0"])
    h.core.start()
    h.admit()
    for rid in sorted(h.running):
        h.complete(rid, 8)
    h.score_all()
    batch, _ = h.core.next_finish_batch(h.store.finish_call)
    results = h.store.finish_many([i for _, i in batch])  # Redis acted, the reply is lost
    again, _ = h.core.next_finish_batch(h.store.finish_call)
    assert again is batch  # the same batch goes out again
    repeat = h.store.finish_many([i for _, i in again])
    assert [r.label for r in repeat] == [f"dup:{r.label.split(':')[0]}" for r in results]
    h.core.finish_applied(again, repeat)
    assert h.core.valid_produced == 1 and not h.core.tasks
    assert Counter(lbl for v in h.ledger().values() for lbl in v) == Counter({"valid": 1, "filtered": 1})


def test_an_outcome_waits_for_the_answer_of_a_record_whose_reply_was_lost() -> None:
    """A task is cancelled while a RECORD of its response is unanswered (the reply lost, the
    driver retrying): its FINISH would delete the response markers, the retry would find the
    attempt ended (`stale`) and memory would miss a response Redis counted. So the outcome waits
    for the answer, and memory and the store count the same completions."""
    h = Hand(cfg_of())
    h.push(["mixed"])
    h.core.start()
    h.admit()
    rid = sorted(h.running)[0]
    h.complete(rid, 8)
    (job,) = h.to_score
    scores = h.core.scores_to_record([(job.task, job.idx, 1.0, "1")])
    owners = [job.task]
    h.store.record(scores)  # Redis counted it; the reply is lost
    h.do(h.core.stop(abort_in_flight=True, reason=RequeueReason.SHUTDOWN))
    assert h.core.next_finish_batch(h.store.finish_call) == ([], [])  # the outcome waits
    assert h.core.has_outcomes_to_write()
    assert h.core.recorded(owners, scores, h.store.record(scores))  # the retry: `dup`
    assert h.core.wants_finish
    h.finish()
    assert h.ledger() == {"e0-0": ["requeued:shutdown"]}
    assert h.core.counts.lengths.completed == h.run.counters["completions"] == 1


def test_a_group_redis_completed_under_a_lost_reply_is_committed_after_the_retry_answers() -> None:
    """The reply of the RECORD of response 0 is lost; response 1's RECORD completes the group
    (Redis counted both): memory sees a ready group while response 0's retry is pending. The commit
    waits for the retry (`dup`), so both responses are counted once in memory, as in Redis."""
    h = Hand(cfg_of())
    h.push(["mixed"])
    h.core.start()
    h.admit()
    for rid in sorted(h.running):
        h.complete(rid, 8)
    first, second = sorted(h.to_score, key=lambda j: j.idx)
    lost = h.core.scores_to_record([(first.task, first.idx, 1.0, "1")])
    h.store.record(lost)  # Redis counted response 0; the reply is lost
    scores = h.core.scores_to_record([(second.task, second.idx, 0.0, "0")])
    assert h.core.recorded([second.task], scores, h.store.record(scores))
    assert second.task.group_complete  # ready in memory
    assert h.core.next_finish_batch(h.store.finish_call) == ([], [])  # the commit waits
    assert h.core.recorded([first.task], lost, h.store.record(lost))  # the retry: `dup`
    h.finish()
    assert h.ledger() == {"e0-0": ["valid"]}
    assert h.core.counts.lengths.completed == h.run.counters["completions"] == 2


def test_fenced_core_drops_everything_and_decides_nothing_more() -> None:
    h = Hand(cfg_of())
    h.push(["mixed"] * 4)
    h.core.start()
    h.admit()
    other = MemoryQueue(h.run, "s2")
    other.store = MemoryGroupStore(h.run, 2, 0)
    other.take_over()
    for rid in sorted(h.running):
        h.complete(rid, 8)
    scored = [(j.task, j.idx, 1.0, "1") for j in h.to_score]
    scores = h.core.scores_to_record(scored)
    owners = [h.core.tasks[(s.pid, s.attempt)] for s in scores]
    assert not h.core.recorded(owners, scores, h.store.record(scores))  # refused: fenced
    h.do(h.core.fence())
    assert h.core.fenced and h.core.phase == Phase.STOPPED and not h.core.tasks
    assert h.core.admissible() == 0 and h.core.next_finish_batch(h.store.finish_call) == ([], [])


def test_pdsr_starts_every_response_fast_caps_them_and_continues_capped_ones_on_the_heavy_pool() -> None:
    h = Hand(
        cfg_of(
            rollout={
                "n": 3,
                "max_concurrent_prompts": 12,
                "long_tail": {"policy": "pdsr", "offload_fraction": 0.25, "cap_factor": 1.0},
            }
        ),
        pools={"fast", "heavy"},
    )
    seen: list[tuple[str, int]] = []

    class Recorder(NullObserver):
        def long_tail(self, action: LongTailAction, tokens: int = 0) -> None:
            seen.append((action.value, tokens))

    h.core.observer = Recorder()
    h.push(["mixed"] * 12)
    h.core.start()
    h.admit(4)
    # no serialising probe: all n of each prompt start at once, on the fast pool, uncapped until
    # the window knows L_cut
    assert len(h.running) == 12 and all(r.pool == "fast" and r.max_tokens == 0 for r in h.running.values())
    for i, rid in enumerate(sorted(h.running)):  # lengths 4..48: L_cut = the 75th percentile
        h.complete(rid, 4 * (i + 1))
    l_cut = h.core.probes.l_cut(0.25)
    assert l_cut == 36.0
    h.admit(4)
    fresh = list(h.running.values())
    assert fresh and all(r.pool == "fast" and r.max_tokens == 36 for r in fresh)
    rid = next(iter(h.running))
    req = h.running[rid]
    h.complete(rid, 36)  # reached the cap: not final, continues on the heavy pool
    assert req.pool == "heavy" and req.max_tokens == 0 and req.continuation is not None
    assert not h.to_score or all(j.task is not req.task or j.idx != req.idx for j in h.to_score[-1:])
    c = h.core.counts
    assert (c.capped_responses, c.capped_groups, c.continued_tokens) == (1, 1, 36)
    assert h.core.probes.running == {req: 36}
    h.complete(req.make_rid(), 70)  # the continuation finishes: final, and scored
    assert not h.core.probes.running and list(h.core.probes.obs)[-1] == (70, True)
    assert h.to_score[-1].task is req.task and h.to_score[-1].idx == req.idx
    # the metrics see the same: 12 final lengths of the first prompts, one capped response and its
    # group (the 36 partial tokens carried to the heavy pool), then its final length
    assert seen[:12] == [("final", 4 * (i + 1)) for i in range(12)]
    assert seen[12:] == [("cap_continue", 36), ("cap_group", 0), ("final", 70)]


def test_pdsr_a_cancel_enters_what_its_responses_reached_into_the_window_as_censored_lengths() -> None:
    h = Hand(
        cfg_of(
            rollout={
                "n": 3,
                "max_concurrent_prompts": 12,
                "long_tail": {"policy": "pdsr", "offload_fraction": 0.25, "cap_factor": 1.0},
            }
        ),
        pools={"fast", "heavy"},
    )
    h.push(["mixed"] * 12)
    h.core.start()
    h.admit(4)
    for i, rid in enumerate(sorted(h.running)):  # 12 final lengths 4..48: L_cut 36
        h.complete(rid, 4 * (i + 1))
    h.admit(4)
    capped_rid = next(iter(h.running))
    capped_req = h.running[capped_rid]
    h.complete(capped_rid, 36)  # capped: continues on the heavy pool from its 36 tokens
    window = list(h.core.probes.obs)
    assert h.core.probes.running == {capped_req: 36}  # while it runs on: ≥ 36, outside the window
    # the run stops and aborts what is still in flight: the capped response is known to be ≥ 36
    # tokens; the others, on their first dispatch, reached a length the cancel does not know (≥ 0: kept out)
    first = [r for r in h.running.values() if r is not capped_req]
    h.do(h.core.stop(abort_in_flight=True))
    assert list(h.core.probes.obs) == [*window, (36, False)] and not h.core.probes.running
    assert h.core.probes.finals == 12
    # their abort replies tell how far they got (the dispatcher passes them on): those enter the
    # window; the capped one's reply adds nothing (it is in already)
    h.core.aborted(first[0], 20)
    h.core.aborted(capped_req, 50)
    assert list(h.core.probes.obs) == [*window, (36, False), (20, False)]
    h.do(h.core.stop(abort_in_flight=True))  # cancelled tasks are not censored twice
    assert list(h.core.probes.obs) == [*window, (36, False), (20, False)]


def _scored_group(cfg: RunConfig, lengths: tuple[int, int]) -> rollout_pb2.Group:
    """One `mixed` prompt (response 0 right, response 1 wrong) of the given lengths, committed."""
    h = Hand(cfg)
    h.push(["mixed"])
    h.core.start()
    h.admit()
    for rid in sorted(h.running):
        h.complete(rid, lengths[h.running[rid].idx])
    h.score_all()
    h.finish()
    (g,) = h.groups()
    return g


def test_the_recorded_reward_is_the_configured_score_of_the_verdict_plus_the_overlong_penalty() -> None:
    # max_response_length 64, overlong buffer 16: penalised from 48 tokens, -1 at 64
    g = _scored_group(cfg_of(), (56, 64))
    right, wrong = g.responses
    assert (right.acc, right.score, right.overlong_penalty, right.reward) == (1.0, 1.0, -0.5, 0.5)
    assert (wrong.acc, wrong.score, wrong.overlong_penalty, wrong.reward) == (0.0, -1.0, -1.0, -2.0)
    assert g.reward_mean == pytest.approx(-0.75)
    assert g.reward_std == pytest.approx(0.5)  # the filter metric (acc), not the reward
    # verl's GSM8K / MATH scorers: 1 / 0, no shaping
    gsm8k = cfg_of(reward={"incorrect_reward": 0.0, "overlong_buffer": {"enable": False}})
    right, wrong = _scored_group(gsm8k, (56, 64)).responses
    assert [(r.score, r.reward) for r in (right, wrong)] == [(1.0, 1.0), (0.0, 0.0)]


def test_an_evaluation_response_gets_the_reward_a_training_response_of_that_verdict_and_length_gets() -> None:
    # the eval path goes through the core: the same ScoreResponse out, the same reward formula in
    core = RolloutCore(
        cfg_of(rollout={"long_tail": {"policy": "pdsr", "offload_fraction": 0.25, "cap_factor": 1.0}})
    )
    task = PromptTask(
        kind=Kind.EVAL, pid="eval-x-0", attempt=0, seq=0, n=2, prompt_token_ids=[1], ground_truth="7"
    )
    first, second = task.make_requests()
    answers = []
    for req, tokens in ((first, 56), (second, 64)):
        req.make_rid()
        resp = gateway_pb2.GenerateResponse(request_id=req.rid, token_ids=[5] * tokens)
        (cmd,) = core.response(req, "gw0", resp)  # no pdsr continuation for an evaluation
        assert isinstance(cmd, ScoreResponse)
        assert (cmd.task, cmd.idx, cmd.ground_truth) == (task, req.idx, "7")
        answers.append(core.eval_scored(task, req.idx, float(req.idx == 0), "7"))
    assert answers == [False, True]  # answered once every response is scored
    assert task.response_gateway == ["gw0", "gw0"]
    assert not core.tasks and core.counts.long_tail_responses == 0  # no train state touched
    right, wrong = task.scores
    assert right is not None and wrong is not None
    train = _scored_group(cfg_of(), (56, 64)).responses  # the train path, same verdicts and lengths
    assert (right.score, right.overlong_penalty, right.reward) == (train[0].score, -0.5, train[0].reward)
    assert (wrong.score, wrong.overlong_penalty, wrong.reward) == (train[1].score, -1.0, train[1].reward)


def test_the_score_filter_metric_uses_the_configured_scores() -> None:
    g = _scored_group(cfg_of(reward={"filter_metric": "score"}), (8, 8))
    assert g.reward_std == pytest.approx(1.0)  # std of (+1, -1): the penalty is not part of the score
    g = _scored_group(cfg_of(reward={"filter_metric": "score", "correct_reward": 3.0}), (8, 8))
    assert g.reward_std == pytest.approx(2.0) and [r.reward for r in g.responses] == [3.0, -1.0]


def test_the_reward_filter_metric_includes_the_overlong_penalty() -> None:
    # verl's seq_reward: two right answers that differ only in their overlong penalty differ
    cfg = cfg_of(reward={"filter_metric": "reward"})
    h = Hand(cfg)
    h.push(["all1"])
    h.core.start()
    h.admit()
    for rid in sorted(h.running):
        h.complete(rid, (8, 56)[h.running[rid].idx])
    h.score_all()
    h.finish()
    (g,) = h.groups()
    assert [r.reward for r in g.responses] == [1.0, 0.5]
    assert g.reward_std == pytest.approx(0.25)  # the std of (1, 0.5): by acc or score it would be 0


def test_validation_samples_with_the_val_settings_training_with_the_rollout_ones() -> None:
    core = RolloutCore(
        cfg_of(rollout={"temperature": 0.9, "top_p": 0.8, "top_k": 20, "val_temperature": 0.5,
                        "val_top_p": 0.7, "val_top_k": 5})
    )  # fmt: skip
    train, val = core.sampling(), core.sampling(validation=True)
    assert (round(train.temperature, 3), round(train.top_p, 3), train.top_k) == (0.9, 0.8, 20)
    assert (round(val.temperature, 3), round(val.top_p, 3), val.top_k) == (0.5, 0.7, 5)
    assert train.max_tokens == val.max_tokens == 64


def test_a_fractional_staleness_bounds_the_valid_groups_of_a_version() -> None:
    # B = 2, s = 0.5: at version 0 at most floor(1.5 * 2) = 3 valid groups, then at 5 (v = 1), ...
    h = Hand(cfg_of(rollout={"max_staleness": 0.5, "max_concurrent_prompts": 8}))
    h.push(["mixed"] * 8)
    h.core.start()
    h.admit()
    for rid in sorted(h.running):
        h.complete(rid, 8)
    h.score_all()
    h.finish()
    assert h.core.valid_produced == 3 and h.core.phase == Phase.BOUND
    h.core.weights_published(1, "/w/v1")
    h.admit()
    for rid in sorted(h.running):
        h.complete(rid, 8, version=1)
    h.score_all()
    h.finish()
    assert h.core.valid_produced == 5
    # a group of version 0 may still train at step 1 = 0 + ceil(0.5): none was requeued as stale
    assert not [lbl for v in h.ledger().values() for lbl in v if lbl == "requeued:stale"]
