"""The long-tail policy `pdsr` applied to live requests (the decisions are in `longtail.py`)."""

from __future__ import annotations

from asyncdapo.config import RunConfig
from asyncdapo.scheduler.dispatcher import Dispatcher
from asyncdapo.scheduler.longtail import FAST, HEAVY, LongTailAction, ProbeWindow, capped, route
from asyncdapo.scheduler.metrics import SchedulerMetrics
from asyncdapo.scheduler.pool import GatewayPool
from asyncdapo.scheduler.tasks import PromptTask, Request
from asyncdapo.v1 import gateway_pb2


class PdsrRouter:
    def __init__(
        self, cfg: RunConfig, pool: GatewayPool, dispatcher: Dispatcher, metrics: SchedulerMetrics
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.probes = ProbeWindow()

    def _pool(self, label: str) -> str:
        """`label` when some gateway carries it, else "" (any gateway): a missing pool never stalls."""
        return label if any(g.pool == label for g in self.pool.members) else ""

    def first_requests(self, task: PromptTask) -> list[Request]:
        """Only the probe goes out first, uncapped, on the fast pool."""
        probe = Request(task, 0, pool=self._pool(FAST))
        task.live = {0: probe}
        return [probe]

    def continues(self, req: Request, resp: gateway_pb2.GenerateResponse) -> bool:
        """After a probe: place the prompt's other responses. After a capped fast response: send
        it on to the heavy pool with its partial tokens and return True (`resp` is not final)."""
        task = req.task
        full = self.cfg.data.max_response_length
        lt = self.cfg.rollout.long_tail
        length = len(resp.token_ids)
        if req.idx == 0 and not task.routed:
            task.routed = True
            self.probes.add(length)
            r = route(length, self.probes.l_cut(lt.offload_fraction), lt.cap_factor, full)
            if r.offloaded:
                self.metrics.long_tail.labels(LongTailAction.OFFLOAD.value).inc()
            cap = r.max_tokens if r.max_tokens < full else 0
            rest = [Request(task, i, pool=self._pool(r.pool), max_tokens=cap) for i in range(1, task.n)]
            for x in rest:
                task.live[x.idx] = x
            self.dispatcher.submit(rest)
            return False
        if req.max_tokens and capped(length, req.max_tokens, full):
            self.metrics.long_tail.labels(LongTailAction.CAP_CONTINUE.value).inc()
            req.continuation = resp
            req.pool = self._pool(HEAVY)
            req.max_tokens = 0
            self.dispatcher.resubmit(req)
            return True
        return False
