"""The fault proxy against a real redis-server: transparent until told, then cut, refuse, or lose
exactly the chosen reply after Redis has acted on the command."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from asyncdapo.tools.faults.proxy import ProxyThread, command, evalsha, script_sha
from asyncdapo.tools.faults.resp import RespParser, encode_command
from asyncdapo.tools.local.ports import free_port


@pytest.fixture()
def direct(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture()
def proxy(redis_url: str) -> Iterator[ProxyThread]:
    port = urlparse(redis_url).port
    assert port
    p = ProxyThread("127.0.0.1", port, resp=True)
    yield p
    p.stop()


def _client(proxy: ProxyThread) -> redis.Redis:
    # no retries: the test must see each fault
    return redis.Redis(port=proxy.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def _raw(proxy: ProxyThread) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    return s


def _read_until_closed(s: socket.socket, limit_s: float = 5.0) -> bytes:
    out = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return out


def test_transparent_for_pipelines_and_large_values(proxy: ProxyThread, direct: redis.Redis) -> None:
    c = _client(proxy)
    big = b"x" * (3 << 20)
    assert c.set("big", big) and c.get("big") == big
    pipe = c.pipeline(transaction=False)
    for _ in range(500):
        pipe.incr("n")
    assert pipe.execute() == list(range(1, 501))
    with c.pipeline(transaction=True) as tx:
        tx.set("a", 1).incr("a")
        assert tx.execute() == [True, 2]
    assert direct.get("n") == b"500"
    assert proxy.stats.commands >= 504 and proxy.stats.lost_replies == 0


def test_cut_all_resets_open_connections(proxy: ProxyThread) -> None:
    c = _client(proxy)
    assert c.ping()
    s = _raw(proxy)
    s.sendall(encode_command("PING"))
    assert s.recv(100) == b"+PONG\r\n"
    assert proxy.cut_all() == 2
    assert _read_until_closed(s) == b""  # reset: nothing more comes
    assert c.ping()  # a client's next command reconnects at once


def test_refuse_for_refuses_then_listens_again(proxy: ProxyThread) -> None:
    c = _client(proxy)
    assert c.ping()
    t0 = time.monotonic()
    proxy.refuse_for(1.0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
    deadline = t0 + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the proxy never listened again"
            time.sleep(0.05)
    assert 0.9 <= time.monotonic() - t0 < 5
    assert c.ping()


def test_lost_reply_redis_acted_on_the_command(proxy: ProxyThread, direct: redis.Redis) -> None:
    c = _client(proxy)
    rule = proxy.lose_reply(command("INCRBY"), nth=2)  # redis-py's incr
    assert c.incr("k") == 1
    with pytest.raises(redis.ConnectionError):
        c.incr("k")
    assert rule.wait(1) and rule.lost_command == [b"INCRBY", b"k", b"1"]
    assert direct.get("k") == b"2"  # executed, only the reply was lost
    assert c.incr("k") == 3  # fires once


def test_lost_reply_in_a_pipeline_forwards_the_replies_before_it(
    proxy: ProxyThread, direct: redis.Redis
) -> None:
    proxy.lose_reply(command("INCR"))
    s = _raw(proxy)
    s.sendall(encode_command("SET", "a", "1") + encode_command("INCR", "x") + encode_command("SET", "b", "2"))
    got = _read_until_closed(s)
    assert [f.value for f in RespParser(requests=False).feed(got)] == ["OK"]
    # every command of the pipeline reached Redis; the chosen reply and those after it were lost
    deadline = time.monotonic() + 5
    while direct.get("b") is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (direct.get("a"), direct.get("x"), direct.get("b")) == (b"1", b"1", b"2")


def test_lost_reply_of_a_command_in_multi_is_lost_at_exec(proxy: ProxyThread, direct: redis.Redis) -> None:
    rule = proxy.lose_reply(command("XACK", "INCR"))
    s = _raw(proxy)
    s.sendall(encode_command("MULTI") + encode_command("INCR", "m") + encode_command("EXEC"))
    got = [f.value for f in RespParser(requests=False).feed(_read_until_closed(s))]
    assert got == ["OK", "QUEUED"] and rule.fired.is_set()
    assert direct.get("m") == b"1"  # the transaction ran


def test_lost_reply_of_the_schedulers_finish_script(proxy: ProxyThread, direct: redis.Redis) -> None:
    from asyncdapo.contracts.redis_keys import RunKeys
    from asyncdapo.services.scheduler.lua import FINISH

    assert direct.script_load(FINISH) == script_sha("finish")
    k = RunKeys("proxy-test")
    direct.hset(k.prompt("p1"), mapping={"attempt": 1, "n": 0})
    direct.hset(k.prompts_claimed, "p1", "o|1|0")
    direct.set(k.scheduler_epoch, 1)
    c = _client(proxy)
    rule = proxy.lose_reply(evalsha("finish"))
    keys = [k.counters, k.prompts_claimed, k.prompts, k.groups, k.scheduler_epoch, k.outcomes]
    keys += [k.prompt("p1"), k.prompt_data("p1")]
    argv = [1, 1, 0, 300, 1000, 0, "p1", 1, "filtered", "", -1, "", 0]
    with pytest.raises(redis.ConnectionError):
        c.evalsha(script_sha("finish"), len(keys), *keys, *argv)
    assert rule.fired.is_set()
    # FINISH ran: the outcome is recorded and the claim released, though the client never heard
    assert direct.hget(k.prompt("p1"), "o:1") == b"filtered" and not direct.hexists(k.prompts_claimed, "p1")
    # the retry a client makes sees the recorded outcome
    assert c.evalsha(script_sha("finish"), len(keys), *keys, *argv) == [[b"dup:filtered", b"0", b"0"]]


def test_raw_mode_and_an_absent_upstream(redis_url: str) -> None:
    port = urlparse(redis_url).port
    assert port
    with ProxyThread("127.0.0.1", port, resp=False) as raw:
        c = _client(raw)
        assert c.set("r", "1") and c.get("r") == b"1"  # bytes pass through unparsed
        assert raw.stats.commands == 0 and raw.cut_all() == 1
    with ProxyThread("127.0.0.1", free_port(), resp=True) as dangling:
        with pytest.raises(redis.ConnectionError):
            _client(dangling).ping()
        assert dangling.stats.upstream_failures == 1
