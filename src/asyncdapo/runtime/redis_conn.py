"""Every Redis client of asyncdapo (sync and asyncio) is built here, so that the password logic
exists once.

The password comes from, first to last:
- the URL itself (`redis://:PASSWORD@host:port/0`), for a user who already writes it there;
- `--redis-password-file FILE` on a command that talks to Redis (`apply_password_flag` exports it
  to the variable below, so the command's own children get it too);
- the environment variable `ASYNCDAPO_REDIS_PASSWORD` (in Kubernetes: from the release's Secret;
  locally: `asyncdapo up` generates one per run directory and hands it to its services).
With none of them the client connects without AUTH, which a Redis with `requirepass` refuses on
the first command (NOAUTH); `check_auth` turns that into an error naming where the password comes
from.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.runtime.secret_files import read_secret

if TYPE_CHECKING:
    import redis
    import redis.asyncio

PASSWORD_ENV = "ASYNCDAPO_REDIS_PASSWORD"
PASSWORD_FLAG = "--redis-password-file"


def redis_password() -> str | None:
    """The password from the environment (None when unset or empty)."""
    return os.environ.get(PASSWORD_ENV) or None


def _kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    password = redis_password()
    if password is not None and "password" not in kwargs:
        kwargs = {**kwargs, "password": password}
    return kwargs


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """`redis.Redis.from_url(url, **kwargs)` with the password (a password in `url` wins)."""
    import redis

    return redis.Redis.from_url(url, **_kwargs(kwargs))


def async_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """`redis.asyncio.Redis.from_url(url, **kwargs)` with the password (a password in `url` wins)."""
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url, **_kwargs(kwargs))


# Replies meaning "Redis is there but cannot serve this now" (a replica being promoted, a disk
# that refuses the snapshot, a cluster re-sharding), matched on the reply's first word.
# redis-py turns some into their own exception classes and drops the word from the message;
# `is_unavailable` checks those by class.
UNAVAILABLE_REPLIES = frozenset({"LOADING", "MASTERDOWN", "MISCONF", "READONLY", "TRYAGAIN", "CLUSTERDOWN"})


# The reply of a Redis at `maxmemory` under `maxmemory-policy noeviction` to a command that may
# grow the data set. It clears on its own: the trainer consumes (and trims) the groups stream and
# finished prompts' state expires, and commands that free memory (XACK, XTRIM, DEL) are still
# served. Nothing was written (a refused MULTI or script writes nothing), so a retry is safe.
FULL_REPLIES = frozenset({"OOM"})


def is_full(err: BaseException) -> bool:
    """True for Redis' refusal of a write at `maxmemory` (`OOM command not allowed when used
    memory > 'maxmemory'`), also when redis-py wrapped it in a pipeline's "Command # n" message."""
    from redis import exceptions as rx

    if isinstance(err, rx.OutOfMemoryError):
        return True
    return isinstance(err, rx.ResponseError) and str(err).split(" ", 1)[0] in FULL_REPLIES


def is_unavailable(err: BaseException) -> bool:
    """True for an error that means Redis is away, not ready yet or full (wait for it: a refused
    or lost connection, a timeout, LOADING and the other replies above, OOM at `maxmemory`), False
    for one a retry does not cure (raise it): a refused password, a script or type error, NOPERM."""
    import redis
    from redis import exceptions as rx

    if is_full(err):
        return True
    if isinstance(err, rx.AuthenticationError | rx.AuthorizationError):
        return False  # a ConnectionError to redis-py, but the user's to fix: never an outage
    if isinstance(err, redis.ConnectionError | redis.TimeoutError):  # BusyLoadingError (LOADING) too
        return True
    if isinstance(err, rx.ReadOnlyError | rx.TryAgainError | rx.ClusterDownError):  # MasterDownError too
        return True
    return isinstance(err, rx.ResponseError) and str(err).split(" ", 1)[0] in UNAVAILABLE_REPLIES


def read_password_file(path: str | Path, flag: str = PASSWORD_FLAG) -> str:
    return read_secret(path, flag)


def add_password_flag(parser: argparse.ArgumentParser | Any) -> None:
    parser.add_argument(
        PASSWORD_FLAG,
        metavar="FILE",
        help=f"file holding the Redis password (default: env {PASSWORD_ENV}; none: no AUTH)",
    )


def apply_password_flag(args: argparse.Namespace) -> None:
    """Make `--redis-password-file` the password of every client this process (and its children)
    builds."""
    path = getattr(args, "redis_password_file", None)
    if path:
        os.environ[PASSWORD_ENV] = read_password_file(path)


def _auth_error(url: str, err: Exception) -> AsyncdapoError:
    given = "is set" if redis_password() else "is not set"
    return AsyncdapoError(
        f"Redis at {redacted_url(url)} refused our credentials ({err}); the password comes from "
        f"{PASSWORD_FLAG} or the environment variable {PASSWORD_ENV} (which {given})"
    )


def redacted_url(url: str) -> str:
    """`url` with its credentials replaced by ***, for messages and logs."""
    head, at, tail = url.rpartition("@")
    return f"{head.split('//', 1)[0]}//***@{tail}" if at else url


def check_auth(client: redis.Redis, url: str) -> None:
    """PING once: a refused password (or a missing one) becomes an AsyncdapoError saying where the
    password comes from; any other failure (Redis not up yet) is left to the caller's retries."""
    import redis

    try:
        client.ping()
    except redis.AuthenticationError as err:
        raise _auth_error(url, err) from None
    except redis.RedisError:
        pass


async def check_auth_async(client: redis.asyncio.Redis, url: str) -> None:
    """`check_auth` for an asyncio client."""
    import redis

    try:
        await client.ping()
    except redis.AuthenticationError as err:
        raise _auth_error(url, err) from None
    except redis.RedisError:
        pass
