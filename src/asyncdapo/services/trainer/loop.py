"""The training loop, top to bottom: wait for B groups → batch → old log-probs → advantages →
PPO update → record → checkpoint → publish → XACK → (validate).

Old log-probs (`algorithm.old_log_prob`): `recompute` runs the current weights over the batch
before the update; `rollout` takes the engines' log-probs of the sampled tokens and skips that
pass, except for responses whose gateway reported none: their rows fall back to recomputed values.

Policy version == completed training steps. Step t trains the weights of version t on groups
whose tokens come from versions in [t - s, t] and produces version t + 1.

Exactly-once training across crashes (see groups_reader): the groups of a step are acknowledged
only after a checkpoint that includes the step is durable; the checkpoint lists them, a restart
acknowledges them again and replays whatever is still pending; entries delivered again at or below
the newest processed stream id are never trained twice; dropped groups are credited exactly once.
Every published version is checkpointed before it is published (`checkpoint_every` only adds
checkpoints in between), so a restart resumes at or after the version rollout runs, never behind it.

One writer (fence.py): rank 0 acquires the run's trainer lease before it reads a checkpoint or the
stream (waiting while another live trainer holds it), and checks it before every trained-log line,
checkpoint and publish; a fenced-out trainer raises TrainerFenced and writes nothing more. Redis
away: every Redis operation waits (runtime.redis_outage.RedisWaiter) instead of failing.

Rank 0 does all I/O (Redis, files, gRPC); other data-parallel ranks receive the groups by broadcast
and only compute.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from asyncdapo.contracts.config import OldLogProbSource, RunConfig, WeightTransport
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import rollout_pb2, scheduler_pb2
from asyncdapo.runtime.redis_outage import RedisWaiter
from asyncdapo.services.trainer.algos import grpo_advantages, tis_weights
from asyncdapo.services.trainer.batch import TrainBatch, build_batch
from asyncdapo.services.trainer.checkpoint import CheckpointStore, TrainerState
from asyncdapo.services.trainer.crash_points import CrashPoint, SimulatedCrash, maybe_crash
from asyncdapo.services.trainer.data_feed import Cursor, PromptFeed, make_encoder
from asyncdapo.services.trainer.dist import DistContext
from asyncdapo.services.trainer.fence import TrainerFence, TrainerFenced
from asyncdapo.services.trainer.fsdp import Sharding, hf_model, unwrap
from asyncdapo.services.trainer.groups_reader import (
    Entry,
    GroupDropReason,
    GroupsReader,
    classify,
    dropped_counter,
)
from asyncdapo.services.trainer.lr_schedule import make_lr_scheduler
from asyncdapo.services.trainer.metrics import PREFIX, JsonlLog, MetricsSink, batch_metrics
from asyncdapo.services.trainer.model import (
    compute_log_probs,
    load_policy,
    packing_supported,
    pad_token_id,
    resolve_precision,
)
from asyncdapo.services.trainer.packing import use_packed_attention
from asyncdapo.services.trainer.publish import (
    TrainerWeightServer,
    VersionNotifier,
    publish,
    remove_snapshot_leftovers,
)
from asyncdapo.services.trainer.redis_io import TRAINER_REDIS_BACKOFF, connect
from asyncdapo.services.trainer.tracking import open_tracking
from asyncdapo.services.trainer.tracking.rollout_metrics import scheduler_status_source
from asyncdapo.services.trainer.trainer_options import (
    TrainerOptions,
    TrainerStateError,
    check_config,
)
from asyncdapo.services.trainer.update import UpdateSettings, old_log_probs, ppo_update, rows_of_rank

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: RunConfig, opts: TrainerOptions, dist: DistContext | None = None) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.opts = opts
        self.dist = dist or DistContext(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        self.keys = RunKeys(cfg.name)
        self.ckpt_dir = Path(cfg.trainer.checkpoint_dir)
        self.state = TrainerState()
        self.settings = UpdateSettings.from_config(cfg)
        self.counters: Counter[str] = Counter()
        self.fence: TrainerFence | None = None
        self._step_drops: list[tuple[str, str]] = []  # (stream id, reason) dropped for the coming step
        self._warned_fallback = False  # old_log_prob rollout: warned once about rows recomputed instead
        try:
            self._setup()
        except BaseException as err:
            self._stop_fence(release=not isinstance(err, SimulatedCrash | TrainerFenced))
            raise

    # ------------------------------------------------------------------ setup and recovery

    def _setup(self) -> None:
        cfg, dev = self.cfg, self.dist.device
        torch.manual_seed(cfg.trainer.seed)
        self.precision = resolve_precision(cfg.model.dtype, dev)
        model, self.tokenizer = load_policy(cfg.model.path, dev, cfg.model.trust_remote_code)
        embedding = hf_model(model).get_input_embeddings().weight
        assert isinstance(embedding, torch.Tensor), "an embedding module has a weight tensor"
        self.vocab_size = int(embedding.shape[0])
        self.pad_id = pad_token_id(self.tokenizer)
        if self.settings.packing and not packing_supported(model):
            log.warning(
                "trainer.packing is on but %s is not a model transformers ships: its attention may not "
                "separate packed sequences, so the trainer computes padded micro-batches",
                type(model).__name__,
            )
            self.settings = replace(self.settings, packing=False)
        self.ref_model = None
        if cfg.algorithm.kl_coef > 0:
            self.ref_model, _ = load_policy(cfg.model.path, dev, cfg.model.trust_remote_code)
            self.ref_model.requires_grad_(False)
        if self.settings.packing:  # SDPA attends sequence by sequence in packed passes (packing.py)
            for m in (model, self.ref_model):
                if m is not None:
                    use_packed_attention(m)
        # DDP replicas or FSDP shards (trainer.sharding), activation checkpointing (fsdp.py)
        self.sharding = Sharding(cfg.trainer, self.dist, self.precision.compute_dtype)
        self.model = self.sharding.wrap(model)
        t = cfg.trainer
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay
        )
        # warm-up, then constant or cosine (lr_schedule.py); stepped once per training step
        self.lr_scheduler = make_lr_scheduler(self.optimizer, t)
        self.store = CheckpointStore(self.ckpt_dir, writer=self.opts.trainer_id)
        if self.dist.is_main:
            self._acquire_fence()
        self.dist.barrier()  # no rank reads a checkpoint before rank 0 holds the lease
        latest = self.store.latest()
        if latest is not None:
            self.state = self.store.load_into(
                latest, *self.sharding.loadable(self.model, self.optimizer), self.lr_scheduler, dev
            )
            self.counters.update(self.state.counters)
            log.info("resumed from %s (step %d)", latest, self.state.step)
        if self.dist.is_main:
            self._setup_io()

    def _acquire_fence(self) -> None:
        """Rank 0: connect, wait for and take the run's trainer lease, then clean up after crashed
        writers (no other writer is live now)."""
        self.waiter = RedisWaiter(TRAINER_REDIS_BACKOFF, url=self.opts.redis_url)
        self.redis = connect(self.opts.redis_url)
        self.fence = TrainerFence(self.redis, self.keys, self.opts.trainer_id, self.waiter, self.opts.lease_s)
        self.fence.acquire()
        self.fence.start_heartbeat()
        removed = self.store.remove_leftovers() + remove_snapshot_leftovers(self.ckpt_dir)
        if removed:
            log.info("removed %d temporary directory(ies) left by crashed writers", removed)

    def _stop_fence(self, release: bool) -> None:
        """Stop the heartbeat; give the lease up unless this process crashed or was fenced."""
        if self.fence is None:
            return
        if release:
            self.fence.release()
        else:
            self.fence.stop_heartbeat()

    def _setup_io(self) -> None:
        from prometheus_client import Gauge

        from asyncdapo.contracts.verl_format import load_examples

        cfg, waiter = self.cfg, self.waiter
        assert self.fence is not None
        self.state.trainer_id, self.state.trainer_epoch = self.fence.trainer_id, self.fence.epoch
        self.encode = make_encoder(self.tokenizer, cfg.data.apply_chat_template)
        examples = load_examples(cfg.data.train_files, cfg.data.prompt_key)
        self.feed = PromptFeed(
            self.redis, self.keys, examples, self.encode,
            watermark=cfg.data.prompt_queue_watermark, max_prompt_length=cfg.data.max_prompt_length,
            seed=cfg.data.seed, shuffle=cfg.data.shuffle, fence=self.fence, truncation=cfg.data.truncation,
        )  # fmt: skip
        ckpt_cursor = Cursor.from_dict(self.state.feed_cursor) if self.state.feed_cursor else None
        waiter.call(lambda _a: self.feed.restore(ckpt_cursor), "prompt feed cursor read")
        out = Path(self.opts.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.trained_log = JsonlLog(out / "trained.jsonl")
        self.trained_log.truncate_after(self.state.step)
        self.reader = GroupsReader(self.redis, self.keys, self.opts.consumer, self.fence, waiter)
        replay, missing = self.reader.start(
            covered_by_checkpoint=self.state.covered_group_ids,
            newest=self.state.last_stream_id,
            dropped=_trained_log_drops(self.trained_log),
        )
        self.counters[dropped_counter(GroupDropReason.MISSING)] += missing
        self.state.covered_group_ids = []
        self.weight_server: TrainerWeightServer | None = None
        if cfg.trainer.weight_transport is WeightTransport.STREAM:  # gateways pull from our memory
            self.weight_server = TrainerWeightServer(
                cfg.trainer.weight_store_dir, self.opts.weight_store_listen, self.opts.weight_store_advertise,
                self.opts.token,
            )  # fmt: skip
            log.info("serving weights at %s", self.weight_server.start())
        self.notifier = VersionNotifier(
            self.redis,
            self.keys,
            self.opts.scheduler,
            self.opts.token,
            fence=self.fence,
            tls_ca=self.opts.scheduler_tls_ca,
        )
        status = scheduler_status_source(self.notifier, cfg.name) if self.opts.scheduler else None
        tracking = open_tracking(cfg, out, self.state.step)  # TensorBoard / W&B / MLflow (logging.*)
        self.metrics = MetricsSink(out / "metrics.jsonl", self.opts.metrics_port, tracking, status)
        self.metrics.truncate_after(self.state.step)
        if (restored := self.store.latest()) is not None:
            self.metrics.checkpoint(restored, self.state.step)
        if self.weight_server is not None:
            self.metrics.registry.register(self.weight_server.bytes_served_collector())
        redis_up = Gauge(PREFIX + "redis_up", "1 while Redis answers, 0 while the trainer waits for it",
                         registry=self.metrics.registry)  # fmt: skip
        redis_full = Gauge(PREFIX + "redis_full", "1 while Redis refuses writes at maxmemory (OOM; they wait)",
                           registry=self.metrics.registry)  # fmt: skip
        waiter.on_change(lambda up: redis_up.set(1 if up else 0))
        waiter.on_change(lambda _up: redis_full.set(1 if waiter.full else 0))
        redis_up.set(1 if waiter.up else 0)  # the state now (a change from here on is told)
        Gauge(PREFIX + "fence_epoch", "Fencing epoch of this trainer (trainer:epoch when it took the lease)",
              registry=self.metrics.registry).set(self.fence.epoch)  # fmt: skip
        # The Evaluate request, built once: the validation set and its encoding never change. A set
        # that does not fit data.max_prompt_length (data.truncation: error, or every prompt dropped)
        # is the user's to fix: the trainer stops now, naming the row, not at step val_every.
        self.val_request: scheduler_pb2.EvaluateRequest | None = None
        if cfg.trainer.val_every and cfg.data.val_files and self.opts.scheduler:
            from asyncdapo.services.trainer.eval_request import eval_request

            val_examples = load_examples(cfg.data.val_files, cfg.data.prompt_key)
            if cfg.data.val_size:
                val_examples = val_examples[: cfg.data.val_size]
            self.val_request = eval_request(cfg, val_examples, self.encode)
        announced = self.notifier.current_version(cfg.name)
        if announced > self.state.step:
            raise TrainerStateError(
                f"rollout is at policy version {announced} but the newest checkpoint under "
                f"{self.store.root} is step {self.state.step}; published versions are always checkpointed, "
                "so that checkpoint is missing: restore it, or start a new run name"
            )
        if announced < self.state.step:  # the crash hit between checkpoint and publish
            self._publish(self.sharding.from_checkpoint(self.model, self.store.latest()))
        elif self.weight_server is not None:
            # serve the version the gateways run: those catching up after a trainer restart, and
            # gateways that start from the trainer's weights (`gateway --weights-from`)
            model = self.sharding.from_checkpoint(self.model, self.store.latest()) or unwrap(self.model)
            self.weight_server.serve_current(
                self.state.step, Path(cfg.model.path), model, self.tokenizer, self.precision.compute_dtype,
                self.opts.trainer_id,
            )  # fmt: skip
        self.state.published_version = self.state.step
        log.info("trainer ready at version %d; %d pending group(s) to replay", self.state.step, replay)

    # ------------------------------------------------------------------ the loop

    def run(self) -> TrainerState:
        total = self.cfg.trainer.total_steps
        done_here = 0
        release = True
        try:
            while self.state.step < total and (
                self.opts.max_steps is None or done_here < self.opts.max_steps
            ):
                self.train_step()
                done_here += 1
        except BaseException as err:
            # a crash (simulated here) keeps its lease until it expires, like a killed process
            release = not isinstance(err, SimulatedCrash | TrainerFenced)
            raise
        finally:
            self.close(release=release)
        return self.state

    def train_step(self) -> dict[str, Any]:
        cfg, dist = self.cfg, self.dist
        version = self.state.step
        t_start = time.perf_counter()

        # 1. wait for B trainable groups (rank 0 reads the stream; every rank gets them)
        entries = dist.broadcast(self._wait_for_groups(version) if dist.is_main else None)
        groups = [rollout_pb2.Group.FromString(raw) for _, raw in entries]
        t_data = time.perf_counter()

        # 2. batch, old log-probs (rows this rank trains), advantages, TIS weights
        batch = build_batch(groups, self.pad_id)
        dev_batch = batch.to(dist.device)
        mine = rows_of_rank(batch, self.settings.groups_per_mini_batch, dist)
        from_rollout = cfg.algorithm.old_log_prob is OldLogProbSource.ROLLOUT
        old_lp, entropy = self._old_log_probs(dev_batch, mine)
        ref_lp = None
        if self.ref_model is not None:
            ref_lp, _ = self._log_probs(self.ref_model, dev_batch, mine, with_entropy=False)
        adv = grpo_advantages(
            dev_batch.rewards, dev_batch.group_ordinal, norm_by_std=cfg.algorithm.norm_adv_by_std
        )
        tis = None
        if cfg.algorithm.tis_cap is not None:
            known = dev_batch.rollout_logprob_mask.bool()
            tis = torch.where(
                known,
                tis_weights(old_lp, dev_batch.rollout_log_probs, cfg.algorithm.tis_cap),
                torch.ones_like(old_lp),
            )

        # 3. PPO update: mini-batches (optimizer steps) of micro-batches (gradient accumulation)
        update = ppo_update(
            self.model, self.optimizer, batch, adv, old_lp, self.settings, dist, self.precision,
            tis_weight=tis, ref_log_prob=ref_lp, first_epoch_stats=from_rollout,
        )  # fmt: skip
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        self.state.step += 1
        # with rollout log-probs the update measures entropy and rollout/kl (update.py)
        stats = self._batch_stats(
            batch, dev_batch, mine, None if from_rollout else old_lp, entropy, tis, version, groups
        )
        t_compute = time.perf_counter()
        maybe_crash(CrashPoint.AFTER_UPDATE, self.state.step)

        # 4. commit (rank 0): trained log → checkpoint → publish → XACK
        timing = {"timing/checkpoint_s": 0.0, "timing/publish_s": 0.0, "timing/snapshot_s": 0.0}
        # sharded weights are gathered onto rank 0 by every rank (a collective) when a step saves them
        full = self.sharding.gather(self.model, self.optimizer) if self._saves_state() else None
        if dist.is_main:
            timing = self._commit(entries, full)
        t_end = time.perf_counter()
        step_s = t_end - t_start
        record: dict[str, Any] = {
            "step": self.state.step,
            "version": self.state.step,
            "lr": lr,
            "workers": dist.world,
            **stats,
            **update,
            "timing/wait_s": t_data - t_start,
            "timing/compute_s": t_compute - t_data,
            **timing,
            "timing/step_s": step_s,
            "timing/wait_frac": (t_data - t_start) / step_s if step_s > 0 else 0.0,
        }
        if dist.is_main:
            record.update(self._maybe_validate())
            self.metrics.write(record)
            log.info(
                "step %d: reward %.3f acc %.3f loss %.4f grad %.3f | wait %.2fs compute %.2fs publish %.2fs",
                self.state.step, record["reward/mean"], record["acc/mean"], record["actor/pg_loss"],
                record["actor/grad_norm"], record["timing/wait_s"], record["timing/compute_s"],
                record["timing/publish_s"],
            )  # fmt: skip
        return record

    # ------------------------------------------------------------------ pieces of a step

    def _wait_for_groups(self, version: int) -> list[tuple[str, bytes]]:
        """B groups trainable at `version`; drops (XACK + count) everything else it reads."""
        need = self.cfg.data.train_batch_size
        window = self.cfg.staleness_window  # ceil(s)
        got: list[tuple[str, rollout_pb2.Group]] = []  # (stream id, group) of the trainable ones
        last_progress = time.monotonic()
        while len(got) < need:
            self.waiter.call(lambda _a: self.feed.refill(), "prompt refill")
            entries = self.reader.read(need - len(got), block_ms=self.opts.poll_ms)
            drops: list[tuple[Entry, GroupDropReason]] = []
            for e in entries:
                reason, detail = (
                    (e.error, e.detail)
                    if e.group is None
                    else classify(
                        e.group, version, window, self.vocab_size, self.cfg.data.max_response_length
                    )
                )
                if reason is None:
                    assert e.group is not None, "an entry without a group carries its error"
                    got.append((e.id, e.group))
                else:
                    drops.append((e, reason))
                    log.warning("dropping group %s (%s): %s", e.id, reason.value, detail)
            credited = self.reader.drop(drops)
            for e, reason in drops:
                self.counters[dropped_counter(reason)] += 1
                self.metrics.dropped.labels(reason=reason.value).inc()
                self._step_drops.append((e.id, reason.value))
            self.counters["groups/credited"] += credited
            # time spent waiting for Redis is not time without groups
            last_progress = max(last_progress, self.waiter.last_recovered)
            if entries:
                last_progress = time.monotonic()
            elif self.opts.max_wait_s is not None and time.monotonic() - last_progress > self.opts.max_wait_s:
                raise TimeoutError(
                    f"no group arrived for {self.opts.max_wait_s:.0f}s at version {version} "
                    f"({len(got)}/{need} groups)"
                )
        return [(eid, group.SerializeToString()) for eid, group in got]

    def _old_log_probs(
        self, dev_batch: TrainBatch, mine: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """pi_old on the rows this rank trains, per `algorithm.old_log_prob` (update.old_log_probs)."""
        old, entropy, fallback = old_log_probs(
            self.cfg.algorithm.old_log_prob, dev_batch, mine,
            lambda rows, with_entropy: self._log_probs(self.model, dev_batch, rows, with_entropy),
        )  # fmt: skip
        if fallback and not self._warned_fallback and self.dist.is_main:
            log.warning(
                "algorithm.old_log_prob is rollout but %d of %d responses carry no behaviour log-probs: "
                "their old log-probs are recomputed with the current weights (rollout/logprob_coverage "
                "shows the share each step)", len(fallback), dev_batch.size,
            )  # fmt: skip
            self._warned_fallback = True
        return old, entropy

    def _log_probs(
        self, model: torch.nn.Module, batch: TrainBatch, rows: list[int], with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (and entropy) for `rows`, scattered into full-size tensors (0 elsewhere)."""
        full_lp = torch.zeros_like(batch.response_mask)
        full_ent = torch.zeros_like(batch.response_mask)
        if rows:
            lp, ent = compute_log_probs(
                unwrap(model), batch.select(rows), micro_batch_size=self.cfg.trainer.micro_batch_size,
                temperature=self.settings.temperature, precision=self.precision, with_entropy=with_entropy,
                packing=self.settings.packing, micro_batch_tokens=self.settings.micro_batch_tokens,
            )  # fmt: skip
            idx = torch.as_tensor(rows, device=full_lp.device)
            full_lp[idx] = lp
            if ent is not None:
                full_ent[idx] = ent
        return full_lp, full_ent

    def _batch_stats(
        self,
        batch: TrainBatch,
        dev_batch: TrainBatch,
        mine: list[int],
        old_lp: torch.Tensor | None,
        entropy: torch.Tensor | None,
        tis: torch.Tensor | None,
        version: int,
        groups: list[rollout_pb2.Group],
    ) -> dict[str, Any]:
        out = batch_metrics(
            batch,
            dev_batch,
            mine,
            old_lp,
            entropy,
            tis,
            self.cfg.algorithm.tis_cap,
            version,
            groups,
            self.dist,
        )
        if self.dist.is_main:
            for k, v in Counter(version - g.min_version for g in groups).items():
                self.metrics.staleness.labels(staleness=str(k)).inc(v)
            for reason in GroupDropReason:
                out[f"dropped/{reason.value}"] = self.counters[dropped_counter(reason)]
            out["groups/credited"] = self.counters["groups/credited"]
            out["groups/redelivered"] = self.reader.redelivered
        return out

    def _saves_state(self) -> bool:
        """Whether this step checkpoints or publishes (the cadence `_commit` applies)."""
        t, step = self.cfg.trainer, self.state.step
        return step % t.publish_every == 0 or step == t.total_steps or step % t.checkpoint_every == 0

    def _commit(
        self, entries: list[tuple[str, bytes]], full: tuple[Any, Any] | None = None
    ) -> dict[str, float]:
        """Durably record the step; returns its timings. Order matters: see the module docstring."""
        t = self.cfg.trainer
        step = self.state.step
        assert self.fence is not None
        self.fence.check()  # a fenced-out trainer writes no trained-log line, checkpoint or version
        ids = [eid for eid, _ in entries]
        self.state.covered_group_ids.extend(ids)
        self.state.last_stream_id = self.reader.newest  # trained or dropped, the redelivery fence
        self.trained_log.write({"step": step, "stream_ids": ids,
                           "group_ids": [rollout_pb2.Group.FromString(raw).prompt_id for _, raw in entries],
                           "dropped": self._step_drops})  # fmt: skip
        self._step_drops = []
        timing = {"timing/checkpoint_s": 0.0, "timing/publish_s": 0.0, "timing/snapshot_s": 0.0}
        publishing = step % t.publish_every == 0 or step == t.total_steps
        # a published version is always durable first: a restart never rolls the policy back
        # behind what rollout already runs (the scheduler only accepts newer versions)
        checkpointed = publishing or step % t.checkpoint_every == 0
        if checkpointed:
            t0 = time.perf_counter()
            self.state.feed_cursor = self.feed.cursor.to_dict()
            self.state.counters = dict(self.counters)
            model, optimizer = full or (unwrap(self.model), self.optimizer)
            saved = self.store.save(
                self.state, model, optimizer, self.lr_scheduler, before_commit=self.fence.check
            )
            self.metrics.checkpoint(saved, step)
            timing["timing/checkpoint_s"] = time.perf_counter() - t0
            maybe_crash(CrashPoint.AFTER_CHECKPOINT, step)
        if publishing:
            res = self._publish(full[0] if full else None)
            timing["timing/publish_s"] = res.write_s + res.notify_s
            timing["timing/snapshot_s"] = res.write_s
            maybe_crash(CrashPoint.AFTER_PUBLISH, step)
        if checkpointed:
            self.reader.commit(self.state.covered_group_ids)  # XACK, then trim the stream
            self.state.covered_group_ids = []
            maybe_crash(CrashPoint.AFTER_ACK, step)
        return timing

    def _publish(self, model: Any = None) -> Any:
        dtype = self.precision.compute_dtype
        res = publish(
            model or unwrap(self.model), self.tokenizer, self.ckpt_dir, self.state.step, dtype, self.notifier,
            writer=self.opts.trainer_id, weight_server=self.weight_server,
        )  # fmt: skip
        self.state.published_version = self.state.step
        return res

    def _maybe_validate(self) -> dict[str, float]:
        """Scheduler.Evaluate every val_every steps; a failure is logged and counted, not fatal."""
        every = self.cfg.trainer.val_every
        req = self.val_request
        if not (every and req is not None and self.state.step % every == 0):
            return {}
        from asyncdapo.services.trainer.publish import PublishError
        from asyncdapo.services.trainer.val_rollouts import evaluate

        stub = self.notifier.scheduler_stub()
        try:
            return self.notifier.call(
                "Evaluate", lambda: evaluate(stub, req, self.notifier.metadata()), attempts=6
            )
        except PublishError as err:
            log.error("validation at step %d failed: %s", self.state.step, err)
            return {"val/failed": 1.0}

    def close(self, release: bool = True) -> None:
        """Stop the lease heartbeat (giving the lease up when `release`) and the I/O."""
        self._stop_fence(release)
        if self.dist.is_main and hasattr(self, "metrics"):
            self.metrics.close()
            self.notifier.close()
            if self.weight_server is not None:
                self.weight_server.close()


def _trained_log_drops(trained_log: JsonlLog) -> dict[str, GroupDropReason]:
    """Stream ids the trained log lists as dropped (a redelivered one is dropped again, never trained)."""
    out: dict[str, GroupDropReason] = {}
    for line in trained_log.read():
        for sid, reason in line.get("dropped", []):
            out[sid] = GroupDropReason(reason)
    return out
