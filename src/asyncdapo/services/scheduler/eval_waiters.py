"""What an evaluation's caller awaits: one future per evaluation task, resolved by the driver.

Apart from the task records (`tasks`), which the rollout core holds and which therefore hold no
asyncio object; `Rollout` owns one `EvalWaiters` and resolves a task's future when the core says
every response of it is scored (`RolloutCore.eval_scored`) or when one of them failed for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from asyncdapo.services.scheduler.outcome_records import DropReason
from asyncdapo.services.scheduler.tasks import PromptTask


class EvalRefused(ValueError):
    """A gateway refused an evaluation request as INVALID_ARGUMENT (its prompt or sampling): every
    gateway serves the same model, so the evaluation ends with this instead of being retried."""


class EvalWaiters:
    def __init__(self) -> None:
        self._futures: dict[PromptTask, asyncio.Future[PromptTask]] = {}  # by identity (eq=False)

    def expect(self, tasks: Iterable[PromptTask]) -> list[asyncio.Future[PromptTask]]:
        """A future per task: its result is the task once every response is scored; its exception
        says why one could not be (`EvalRefused`: the request was refused; RuntimeError: the
        gateways or the verifier failed)."""
        loop = asyncio.get_running_loop()
        out = []
        for t in tasks:
            fut: asyncio.Future[PromptTask] = loop.create_future()
            self._futures[t] = fut
            out.append(fut)
        return out

    def forget(self, tasks: Iterable[PromptTask]) -> None:
        """Drop the futures still unresolved (the caller stopped waiting: one failed, or it was
        cancelled); their requests' late answers then resolve nothing."""
        for t in tasks:
            self._futures.pop(t, None)

    def gave_up(self, task: PromptTask, detail: str, refused: bool) -> None:
        """The dispatcher gave up a request of `task`: a gateway refused it (`refused`: the caller's
        input, named by its index in the request) or kept failing."""
        if refused:  # an evaluation task's seq is its index in the request
            self.resolve(task, f"prompts[{task.seq}]: a gateway refused it: {detail}", refused=True)
        else:
            self.resolve(task, f"{DropReason.GATEWAY_ERROR}: {detail}")

    def resolve(self, task: PromptTask, error: str = "", refused: bool = False) -> None:
        """Every response of `task` is scored (`error` ""), or one cannot be (`error` says why;
        `refused`: a gateway refused the request itself)."""
        fut = self._futures.pop(task, None)
        if fut is None or fut.done():
            return
        if error:
            fut.set_exception(EvalRefused(error) if refused else RuntimeError(error))
        else:
            fut.set_result(task)
