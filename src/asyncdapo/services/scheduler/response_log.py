"""`--response-log`: one JSON line per training response the scheduler saw end — the run's own
generations, as `asyncdapo simulate --replay` reads them back.

Why: the groups stream holds only the valid groups (a replay of it would never filter), and the
gateways' step logs hold no per-request lengths. This log holds every response of every attempt:
    {"t": 1795524967.41, "event": "judged", "pid": "e0-17", "attempt": 1, "idx": 3,
     "tokens": 412, "acc": 1.0, "prompt_tokens": 93, "queue_s": 0.412, "generate_s": 9.87}
`event`:
- `judged`: the verifier scored it while its task was open (`acc`: the verifier's accuracy);
- `aborted`: its task was cancelled (early stop, a fifo or long-tail abort) and the engine's abort
  reply said it had generated `tokens` — its natural length is at least that;
- `late`: it finished after its task was cancelled, `tokens` long, never scored.
`tokens` counts the whole response (a continuation's earlier tokens included). `queue_s` is the
engine's time from the request's arrival to its first token (vLLM's first-token latency: its wait
in the engine's queue and its prefill; vLLM says it only with the gateway's `--vllm-metrics`,
otherwise 0), `generate_s` the gateway's from the request's arrival to its reply (always) — where
a request spent its time, which the step logs cannot say. The file is opened
for append, line-buffered: a restarted scheduler adds to it; a crash loses at most a line.

Writing is best-effort observability, never a reason to stop a run: an OSError (full disk) is
logged once and the log closes itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.services.scheduler.tasks import PromptTask, ResponseView

log = logging.getLogger(__name__)


class ResponseEvent(StrEnum):
    JUDGED = "judged"
    ABORTED = "aborted"
    LATE = "late"


class ResponseLog:
    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if not p.resolve().parent.is_dir():
            raise AsyncdapoError(
                f"--response-log {str(path)!r}: directory {str(p.resolve().parent)!r} does not exist"
            )
        self.path = p
        self._f: IO[str] | None = open(p, "a", buffering=1)  # noqa: SIM115 (closed by close())

    def judged(self, rows: Iterable[tuple[LoggedResponse, float]]) -> None:
        """Scored responses, each with the verifier's accuracy."""
        now = round(time.time(), 4)
        self._write(r.line(now, ResponseEvent.JUDGED) | {"acc": acc} for r, acc in rows)

    def cut(self, event: ResponseEvent, response: LoggedResponse) -> None:
        """A response of a cancelled task: its abort reply (`ABORTED`) or a finish that came too
        late (`LATE`)."""
        self._write([response.line(round(time.time(), 4), event)])

    def _write(self, lines: Iterable[dict[str, object]]) -> None:
        if self._f is None:
            return
        try:
            self._f.write("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
        except OSError as err:
            log.error("--response-log %s: %s; no more responses are logged", self.path, err)
            self.close()

    def close(self) -> None:
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.close()
            except OSError as err:
                log.error("--response-log %s: %s", self.path, err)


@dataclass(frozen=True, slots=True)
class LoggedResponse:
    """One response as the log writes it."""

    pid: str
    attempt: int
    idx: int
    tokens: int
    prompt_tokens: int
    queue_s: float
    generate_s: float

    @classmethod
    def of(cls, task: PromptTask, idx: int, tokens: int, resp: ResponseView | None) -> LoggedResponse:
        """`tokens` is passed, not read from `resp`: a scored response is logged after RECORD's
        round trip, and by then its task may no longer hold it (`resp` None: no timing, 0 s) —
        logging must never raise on the scoring path."""
        queue_s, generate_s = (resp.queue_s, resp.generate_s) if resp is not None else (0.0, 0.0)
        return cls(task.pid, task.attempt, idx, tokens, len(task.prompt_token_ids), queue_s, generate_s)

    def line(self, t: float, event: ResponseEvent) -> dict[str, object]:
        return {"t": t, "event": event.value, "pid": self.pid, "attempt": self.attempt, "idx": self.idx,
                "tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
                "queue_s": round(self.queue_s, 4), "generate_s": round(self.generate_s, 4)}  # fmt: skip
