"""`asyncdapo up`'s progress: a live line that keeps to the terminal's width; plain lines elsewhere."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.local.live_view import Progress, StatusLine

STATUS = {"rollout/policy_version": 12, "rollout/valid_group_ratio": 0.61, "rollout/aborted_tokens": 123456,
          "rollout/early_stops": 12, "rollout/generated_tokens": 999999}  # fmt: skip
ROW = {"step": 12, "reward/mean": 0.4375, "acc/mean": 0.5, "rollout/valid_group_ratio": 0.61}


def _render(width: int) -> list[str]:
    p = Progress(RunConfig(), live=False, out=io.StringIO())
    p.last = ROW
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    with console.capture() as cap:
        console.print(StatusLine(12, 100, p.fields(STATUS, 60.0)))
    return cap.get().splitlines()


@pytest.mark.parametrize("width", [40, 80, 120, 200])
def test_live_line_fits_the_terminal(width: int) -> None:
    lines = _render(width)
    assert len(lines) == 1, lines  # one line: never wraps ("smears")
    assert len(lines[0].rstrip()) <= width
    assert "step 12/100" in lines[0]


def test_wider_terminals_show_more() -> None:
    narrow, wide = _render(80)[0], _render(200)[0]
    assert "early stops" in wide and "early stops" not in narrow
    assert "ETA" in narrow and "reward 0.438" in narrow


def test_not_a_tty_prints_one_plain_line_per_step() -> None:
    out = io.StringIO()
    p = Progress(RunConfig(), live=True, out=out)  # asked for live, but the output is not a terminal
    p.stage("redis")
    p.tick(STATUS, 1.0)
    p.step(ROW)
    p.tick(STATUS, 2.0)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "▸ starting redis",
        "step 12/100: reward 0.438 acc 0.500 valid 0.61 len — aborted — tok",
    ]
    assert "\x1b" not in out.getvalue()
