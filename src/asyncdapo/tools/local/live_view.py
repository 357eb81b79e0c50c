"""What `asyncdapo up` shows while it runs, drawn with `rich`.

On a terminal: a spinner with the elapsed time while each service starts, then a live status line
(bar, step, version, reward, accuracy, valid ratio, tokens/s, aborts, ETA) that keeps to the
terminal's width, dropping the least important fields first, with one line per finished step above
it. Elsewhere (a pipe, a log file, CI): plain lines only, one per stage and one per step.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from asyncdapo.contracts.config import RunConfig


def _f(v: Any, spec: str = ".3f") -> str:
    return format(v, spec) if isinstance(v, int | float) else "—"


class _Elapsed:
    """A spinner's text that shows how long the current stage has taken (re-rendered each refresh)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.t0 = time.monotonic()

    def __rich__(self) -> Text:
        return Text(f"starting {self.what} … {time.monotonic() - self.t0:.0f} s")


class StatusLine:
    """The live line: a bar sized to the terminal, then as many fields as fit, in priority order."""

    def __init__(self, step: int, total: int, fields: list[str]) -> None:
        self.step, self.total, self.fields = step, total, fields

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        bar_w = max(6, min(30, width // 6))
        text = ""
        for field in self.fields:  # most important first; stop at the first that does not fit
            candidate = f"{text}  {field}" if text else field
            if len(candidate) > width - bar_w - 1:
                break
            text = candidate
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=bar_w)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        grid.add_row(ProgressBar(total=max(self.total, 1), completed=self.step, width=bar_w), text)
        yield grid


class Progress:
    def __init__(self, cfg: RunConfig, live: bool = True, out: Any = sys.stdout) -> None:
        self.total = cfg.trainer.total_steps
        self.console = Console(file=out, highlight=False, soft_wrap=False)
        self.live = live and self.console.is_terminal
        self.last: dict[str, Any] = {}
        self._tokens_prev: tuple[float, int] | None = None
        self.tokens_per_s = 0.0
        self._stage: tuple[str, float] | None = None
        self._spinner: Any = None
        self._live: Live | None = None

    def _print(self, text: str) -> None:
        self.console.print(Text(text), soft_wrap=True)  # above the spinner / live line when shown

    # --- start-up stages ---

    def stage(self, what: str) -> None:
        self._end_stage()
        self._stage = (what, time.monotonic())
        if self.live:
            self._spinner = self.console.status(_Elapsed(what), refresh_per_second=4)
            self._spinner.start()
        else:
            self._print(f"▸ starting {what}")

    def _end_stage(self) -> None:
        if self._stage is None:
            return
        what, t0 = self._stage
        self._stage = None
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None
            self._print(f"✓ {what} ({time.monotonic() - t0:.0f} s)")

    def note(self, text: str) -> None:
        self._end_stage()  # notes report on what just finished
        self._print(f"  {text}")

    # --- training ---

    def step(self, row: dict[str, Any]) -> None:
        self._end_stage()
        self.last = row
        val = f" val_acc {_f(row['val/accuracy'])}" if "val/accuracy" in row else ""
        # short enough for 80 columns with typical values
        self._print(
            f"step {row.get('step')}/{self.total}: reward {_f(row.get('reward/mean'))} "
            f"acc {_f(row.get('acc/mean'))} valid {_f(row.get('rollout/valid_group_ratio'), '.2f')} "
            f"len {_f(row.get('response_length/mean'), '.1f')} "
            f"aborted {row.get('rollout/aborted_tokens', '—')} tok{val}"
        )

    def fields(self, status: dict[str, Any], elapsed_s: float) -> list[str]:
        """The live line's fields, most important first."""
        step = int(self.last.get("step", 0))
        eta = (elapsed_s / step * (self.total - step)) if step else None
        return [
            f"step {step}/{self.total}",
            f"ETA {_f(eta, '.0f')} s",
            f"reward {_f(self.last.get('reward/mean'))}",
            f"acc {_f(self.last.get('acc/mean'))}",
            f"{self.tokens_per_s:,.0f} tok/s",
            f"valid {_f(status.get('rollout/valid_group_ratio'), '.2f')}",
            f"v{status.get('rollout/policy_version', 0)}",
            f"aborted {status.get('rollout/aborted_tokens', 0)} tok",
            f"{status.get('rollout/early_stops', 0)} early stops",
        ]

    def tick(self, status: dict[str, Any], elapsed_s: float) -> None:
        tokens = int(status.get("rollout/generated_tokens", 0))
        if self._tokens_prev is not None and elapsed_s > self._tokens_prev[0]:
            rate = (tokens - self._tokens_prev[1]) / (elapsed_s - self._tokens_prev[0])
            self.tokens_per_s = 0.7 * self.tokens_per_s + 0.3 * rate
        self._tokens_prev = (elapsed_s, tokens)
        if not self.live:
            return
        self._end_stage()
        line = StatusLine(int(self.last.get("step", 0)), self.total, self.fields(status, elapsed_s))
        if self._live is None:
            self._live = Live(line, console=self.console, refresh_per_second=4, transient=True)
            self._live.start()
        else:
            self._live.update(line)

    def close(self) -> None:
        self._end_stage()
        if self._live is not None:
            self._live.stop()
            self._live = None


class TaskProgress:
    """Progress of a one-time job with a known number of steps (the warm-start's SFT steps): a bar
    with rate and ETA on a terminal, a line every 10 % elsewhere. Use as a context manager; call
    `update(done, **fields)` after each step."""

    def __init__(self, description: str, total: int, out: Any = sys.stdout) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self.description, self.total = description, max(total, 1)
        self.console = Console(file=out, highlight=False)
        self._bar: Any = None
        self._next_line = 0.1
        self._t0 = time.monotonic()
        if self.console.is_terminal:
            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=self.console, transient=False,
            )  # fmt: skip
            self._task = self._bar.add_task(description, total=self.total, info="")

    def __enter__(self) -> TaskProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def update(self, done: int, **fields: Any) -> None:
        info = " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
        elif done / self.total >= self._next_line or done == self.total:
            self._next_line = (int(done * 10 / self.total) + 1) / 10
            self.console.print(
                Text(f"{self.description}: {done}/{self.total} {info} ({time.monotonic() - self._t0:.0f} s)"),
                soft_wrap=True,
            )

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
