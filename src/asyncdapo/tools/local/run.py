"""One local run from start to report: start the stack, measure validation accuracy before training,
start rollout, follow progress, stop everything, write `runs/NAME/{metrics.jsonl,report.md,report.png}`.

The last line printed is machine-readable:
`RESULT val_acc_before=… val_acc_after=… steps=… early_stops=… aborted_tokens=… wall_s=…`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.runtime.grpc_security import bearer_metadata
from asyncdapo.tools.local.live_view import Progress
from asyncdapo.tools.local.report import read_metrics, write_report
from asyncdapo.tools.local.stack import LocalStack, StackOptions

Metadata = tuple[tuple[str, str], ...]


class RunTimeout(AsyncdapoError):
    pass


def _scheduler_stub(address: str):
    import grpc

    from asyncdapo.contracts.v1 import scheduler_pb2_grpc

    channel = grpc.insecure_channel(address)
    return channel, scheduler_pb2_grpc.SchedulerStub(channel)


def run_status(stub, run: str) -> dict[str, Any]:
    from asyncdapo.contracts.v1 import scheduler_pb2
    from asyncdapo.services.trainer.tracking.rollout_metrics import status_metrics

    return status_metrics(stub.GetRun(scheduler_pb2.GetRunRequest(run=run), timeout=5.0))


def stop_rollout(stub, run: str, timeout_s: float = 30.0, metadata: Metadata = ()) -> dict[str, Any]:
    """StopRun with abort: prompts still in flight get their outcome (requeued) before shutdown."""
    from asyncdapo.contracts.v1 import scheduler_pb2

    req = scheduler_pb2.StopRunRequest(run=run, abort_in_flight=True)
    stub.StopRun(req, timeout=10.0, metadata=metadata)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = stub.GetRun(scheduler_pb2.GetRunRequest(run=run), timeout=5.0)
        if st.phase == scheduler_pb2.RUN_PHASE_STOPPED:
            break
        time.sleep(0.2)
    return run_status(stub, run)


def validate(cfg: RunConfig, stub, metadata: Metadata = ()) -> float | None:
    """Accuracy of the current policy on the validation files through Scheduler.Evaluate."""
    if not cfg.data.val_files:
        return None
    from transformers import AutoTokenizer

    from asyncdapo.contracts.prompting import prompt_token_ids, render_prompt
    from asyncdapo.contracts.verl_format import Example, load_examples
    from asyncdapo.runtime.models import resolve_model
    from asyncdapo.services.trainer.eval_request import eval_request

    tok = AutoTokenizer.from_pretrained(resolve_model(cfg.model.path, "model.path"))
    examples = load_examples(cfg.data.val_files, cfg.data.prompt_key)
    if cfg.data.val_size:
        examples = examples[: cfg.data.val_size]

    def encode(e: Example) -> tuple[list[int], str]:
        return prompt_token_ids(e, tok, cfg.data.apply_chat_template), render_prompt(
            e, tok, cfg.data.apply_chat_template
        )

    req = eval_request(cfg, examples, encode)
    return stub.Evaluate(req, timeout=600.0, metadata=metadata).accuracy


def prepare_run_dir(run_dir: Path, *, fresh: bool, resume: bool) -> None:
    """A run directory holds Redis (AOF) and checkpoints: reuse it only when asked to."""
    import shutil

    has_state = (run_dir / "redis").exists() or (run_dir / "trainer").exists()
    if has_state and fresh:
        shutil.rmtree(run_dir)
    elif has_state and not resume:
        raise AsyncdapoError(
            f"{run_dir} holds a previous run (Redis state, checkpoints): pass --fresh to start over "
            "or --resume to continue it"
        )


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)


def _tracking_note(cfg: RunConfig, run_dir: Path) -> str:
    from asyncdapo.services.trainer.tracking import tracking_dir

    if not cfg.logging.backends:
        return "none"
    where = _relative(tracking_dir(cfg, run_dir / "trainer"), run_dir)
    return ", ".join(b.value for b in cfg.logging.backends) + f" under {where}"


def write_resolved_config(run_dir: Path, cfg: RunConfig, *, source: str, overrides: list[str]) -> Path:
    """runs/NAME/config.yaml: the config the services run with; its header names where it came from."""
    from asyncdapo.contracts.config import dump_run_config

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    head = [f"# Resolved run config: {source}" + (" with overrides:" if overrides else "")]
    head += [f"#   {o}" for o in overrides]
    head.append(f"# Reproduce: asyncdapo up {path}")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(head) + "\n" + dump_run_config(cfg))
    tmp.replace(path)
    return path


def run_local(cfg: RunConfig, opts: StackOptions, *, timeout_s: float, live: bool) -> int:
    start = time.monotonic()
    run_dir = Path(opts.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    merged_path = run_dir / "metrics.jsonl"
    merged_path.touch()
    trainer_metrics = run_dir / "trainer" / "metrics.jsonl"
    progress = Progress(cfg, live=live)
    stack = LocalStack(cfg, opts)
    val_before: float | None = None
    status: dict[str, Any] = {}
    interrupted = False
    try:
        ep = stack.start(on_stage=progress.stage)
        channel, stub = _scheduler_stub(ep.scheduler)
        progress.note(f"services up in {time.monotonic() - start:.0f} s; logs in {stack.logs}")
        progress.stage("validation before training")
        auth = bearer_metadata(ep.token)
        val_before = validate(cfg, stub, auth)
        if val_before is not None:
            progress.note(f"validation accuracy before training: {val_before:.3f}")
            with merged_path.open("a") as f:
                f.write(json.dumps({"step": 0, "val/accuracy": val_before}) + "\n")
        progress.stage("trainer")
        stack.start_trainer()
        seen = 0
        while True:
            stack.check()
            status = run_status(stub, cfg.name)
            rows = read_metrics(trainer_metrics)
            for row in rows[seen:]:
                # the trainer's own rollout/* values (read at the end of its step) are kept: they
                # are what its trackers logged; older values fill in when it could not read them
                row = {**{k: v for k, v in status.items() if k != "rollout/outcomes"}, **row}
                with merged_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                progress.step(row)
            seen = len(rows)
            progress.tick(status, time.monotonic() - start)
            if stack.trainer_finished():
                break
            if time.monotonic() - start > timeout_s:
                raise RunTimeout(f"run did not finish within {timeout_s:.0f} s (see {stack.logs})")
            time.sleep(1.0)
        status = stop_rollout(stub, cfg.name, metadata=auth)
        channel.close()
    except KeyboardInterrupt:
        interrupted = True
        progress.note("interrupted: stopping every service")
    finally:
        progress.close()
        stack.stop()

    rows = read_metrics(merged_path)
    val_rows = [
        r["val/accuracy"]
        for r in rows
        if r.get("step", 0) > 0 and isinstance(r.get("val/accuracy"), int | float)
    ]
    summary = {
        "run": cfg.name,
        "val_acc_before": val_before,
        "val_acc_after": val_rows[-1] if val_rows else None,
        "steps": max((r.get("step", 0) for r in rows), default=0),
        "early_stops": status.get("rollout/early_stops", 0),
        "aborted_tokens": status.get("rollout/aborted_tokens", 0),
        "outcomes": status.get("rollout/outcomes", {}),
        "wall_s": round(time.monotonic() - start, 1),
        "config": _relative(Path(opts.config_path), run_dir),
        "tracking": _tracking_note(cfg, run_dir),
    }
    report = write_report(run_dir, summary, rows)
    print(f"\nreport: {report} (plots: {run_dir / 'report.png'}); logs: {stack.logs}")

    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    keys = ("val_acc_before", "val_acc_after", "steps", "early_stops", "aborted_tokens", "wall_s")
    print("RESULT " + " ".join(f"{k}={fmt(summary[k])}" for k in keys))
    sys.stdout.flush()
    return 130 if interrupted else 0
