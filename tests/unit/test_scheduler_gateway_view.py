"""`pool.Gateway`'s dispatch-view attributes are copies: they must follow every change of what
they are copied from, or the dispatcher would place requests on a paused or draining gateway."""

from __future__ import annotations

from asyncdapo.contracts.v1 import gateway_pb2
from asyncdapo.services.scheduler.gateway_pool import Gateway
from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy, RejectReason, pick


async def test_view_attributes_follow_the_load_report_and_our_flags() -> None:
    gw = Gateway("127.0.0.1:1", None)
    gw.up = True
    gw.load = gateway_pb2.Load(
        capacity=8, running=3, waiting=1, kv_cache_usage=0.5, weight_version=2, pool="fast"
    )
    assert (gw.capacity, gw.running, gw.waiting, gw.kv_cache_usage, gw.weight_version, gw.pool) == (
        8, 3, 1, 0.5, 2, "fast",
    )  # fmt: skip
    policy = DispatchPolicy(max_in_flight=16)
    assert pick([gw], policy).addresses == [gw.address]

    gw.drain_requested = True
    assert gw.draining and pick([gw], policy).rejected == {gw.address: RejectReason.DRAINING}
    gw.drain_requested = False
    gw.publishing = True
    assert gw.paused and pick([gw], policy).rejected == {gw.address: RejectReason.PAUSED}
    gw.publishing = False
    assert not gw.paused

    gw.load = gateway_pb2.Load(capacity=8, paused=True)
    assert gw.paused and gw.running == 0
    gw.load.paused = False  # changed in place (a weight update's resume): refresh() picks it up
    gw.refresh()
    assert not gw.paused and pick([gw], policy).addresses == [gw.address]
    gw.load = gateway_pb2.Load(draining=True)
    assert gw.draining
    await gw.channel.close()
