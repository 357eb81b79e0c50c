"""What `asyncdapo up` shows while it runs: a live status line on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys
from typing import Any

from asyncdapo.config import RunConfig


def _f(v: Any, spec: str = ".3f") -> str:
    return format(v, spec) if isinstance(v, int | float) else "—"


class Progress:
    def __init__(self, cfg: RunConfig, live: bool = True, out=sys.stdout) -> None:
        self.total = cfg.trainer.total_steps
        self.out = out
        self.live = live and out.isatty()
        self.last: dict[str, Any] = {}
        self.step_times: list[float] = []
        self._tokens_prev: tuple[float, int] | None = None
        self.tokens_per_s = 0.0
        self._line_open = False

    def _print(self, text: str) -> None:
        if self._line_open:
            self.out.write("\r\033[K")
            self._line_open = False
        self.out.write(text + "\n")
        self.out.flush()

    def stage(self, what: str) -> None:
        self._print(f"▸ starting {what}")

    def note(self, text: str) -> None:
        self._print(f"  {text}")

    def step(self, row: dict[str, Any]) -> None:
        self.last = row
        val = f" val_acc {_f(row['val/accuracy'])}" if "val/accuracy" in row else ""
        self._print(
            f"step {row.get('step')}/{self.total}: reward {_f(row.get('reward/mean'))} "
            f"acc {_f(row.get('acc/mean'))} valid-ratio {_f(row.get('rollout/valid_group_ratio'), '.2f')} "
            f"resp-len {_f(row.get('response_length/mean'), '.1f')} "
            f"aborted-tokens {row.get('rollout/aborted_tokens', '—')}{val}"
        )

    def tick(self, status: dict[str, Any], elapsed_s: float) -> None:
        tokens = int(status.get("rollout/generated_tokens", 0))
        if self._tokens_prev is not None and elapsed_s > self._tokens_prev[0]:
            rate = (tokens - self._tokens_prev[1]) / (elapsed_s - self._tokens_prev[0])
            self.tokens_per_s = 0.7 * self.tokens_per_s + 0.3 * rate
        self._tokens_prev = (elapsed_s, tokens)
        if not self.live:
            return
        step = int(self.last.get("step", 0))
        eta = (elapsed_s / step * (self.total - step)) if step else None
        width = 24
        filled = int(width * step / max(self.total, 1))
        bar = "█" * filled + "·" * (width - filled)
        line = (
            f"[{bar}] step {step}/{self.total} v{status.get('rollout/policy_version', 0)} "
            f"reward {_f(self.last.get('reward/mean'))} acc {_f(self.last.get('acc/mean'))} "
            f"valid {_f(status.get('rollout/valid_group_ratio'), '.2f')} {self.tokens_per_s:,.0f} tok/s "
            f"aborted {status.get('rollout/aborted_tokens', 0)} tok, {status.get('rollout/early_stops', 0)} early stops "
            f"ETA {_f(eta, '.0f')} s"
        )
        self.out.write("\r\033[K" + line)
        self.out.flush()
        self._line_open = True

    def close(self) -> None:
        if self._line_open:
            self.out.write("\n")
            self._line_open = False
