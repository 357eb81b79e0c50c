"""Redis itself compiles every Lua script of asyncdapo.contracts.redis_scripts (a syntax error in
a .lua file fails here, not in the first run that needs the script) and names it by the SHA-1 the
clients compute for EVALSHA and the fault proxy's predicates."""

from __future__ import annotations

import hashlib

import redis

from asyncdapo.contracts.redis_scripts import RedisScript, script


def test_redis_compiles_every_script_under_the_sha_the_clients_compute(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for name in RedisScript:
        text = script(name)
        assert r.script_load(text) == hashlib.sha1(text.encode()).hexdigest(), name
    assert all(r.script_exists(*[hashlib.sha1(script(s).encode()).hexdigest() for s in RedisScript]))
