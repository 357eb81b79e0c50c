"""Every Lua script run on Redis, one `<name>.lua` file each in this folder: part of the Redis data
model (`asyncdapo.contracts.redis_keys`), read once here and handed out by name.

A file is a header of `--` comment lines (what the script does, its KEYS and ARGV, what it returns,
who calls it) and then the script. `script(name)` returns the script without its header: what Redis
runs and what its SHA-1 (EVALSHA) is computed from, so rewording a header changes no SHA. Comments
inside the script stay in it.

A prelude (`LuaPrelude`) is never run alone: `script()` prepends the preludes `PRELUDES` names for a
script (the trainer's fence check, stream-id helpers) to its text, in order; the script's header
names them too (`-- Preludes: a.lua, b.lua`).

A file missing from the installed package (a wheel built without its `*.lua` package data) fails
the first import of this module, naming the file: no service starts with a script it cannot run.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from enum import StrEnum
from importlib.resources.abc import Traversable
from types import MappingProxyType
from typing import Final

from asyncdapo.contracts.errors import AsyncdapoError

SUFFIX: Final = ".lua"


class RedisScript(StrEnum):
    """A script run on Redis; the value is its file name without `.lua`."""

    # the scheduler's group-state and queue transitions (asyncdapo.services.scheduler.lua)
    SCHEDULER_TAKEOVER = "scheduler_takeover"
    SCHEDULER_LEASE = "scheduler_lease"
    SCHEDULER_RELEASE = "scheduler_release"
    SCHEDULER_CLAIM = "scheduler_claim"
    SCHEDULER_RECORD = "scheduler_record"
    SCHEDULER_FINISH = "scheduler_finish"
    SCHEDULER_COUNT = "scheduler_count"
    # the trainer's lease and fence (asyncdapo.services.trainer.fence)
    TRAINER_LEASE_ACQUIRE = "trainer_lease_acquire"
    TRAINER_LEASE_RENEW = "trainer_lease_renew"
    TRAINER_LEASE_RELEASE = "trainer_lease_release"
    # the trainer's reads and writes of the groups stream (asyncdapo.services.trainer.groups_reader)
    TRAINER_GROUPS_READ = "trainer_groups_read"
    TRAINER_GROUPS_SETTLE = "trainer_groups_settle"
    TRAINER_GROUPS_CLAIM_ALL = "trainer_groups_claim_all"
    TRAINER_GROUPS_COMMIT = "trainer_groups_commit"
    # the invariant checker's atomic read (asyncdapo.tools.faults.snapshot)
    FAULTS_SNAPSHOT = "faults_snapshot"


class LuaPrelude(StrEnum):
    """Lua text that scripts start with (never run alone); the value is its file name without `.lua`."""

    TRAINER_FENCE_CHECK = "trainer_fence_check"
    TRAINER_STREAM_IDS = "trainer_stream_ids"


_FENCED_IDS = (LuaPrelude.TRAINER_FENCE_CHECK, LuaPrelude.TRAINER_STREAM_IDS)

# What each script starts with, in order (a script not listed has no prelude).
PRELUDES: Final[Mapping[RedisScript, tuple[LuaPrelude, ...]]] = MappingProxyType(
    {
        RedisScript.TRAINER_GROUPS_READ: _FENCED_IDS,
        RedisScript.TRAINER_GROUPS_SETTLE: (LuaPrelude.TRAINER_FENCE_CHECK,),
        RedisScript.TRAINER_GROUPS_CLAIM_ALL: _FENCED_IDS,
        RedisScript.TRAINER_GROUPS_COMMIT: _FENCED_IDS,
    }
)


class RedisScriptMissing(AsyncdapoError):
    """A Lua script file is not where the installed package should have it."""


def strip_header(source: str) -> str:
    """The script of a file's text: everything after its leading `--` comment lines."""
    lines = source.splitlines(keepends=True)
    n = 0
    while n < len(lines) and lines[n].startswith("--"):
        n += 1
    return "".join(lines[n:])


def read_sources(folder: Traversable, names: list[str]) -> dict[str, str]:
    """The file text of each `<name>.lua` under `folder`; a missing file raises RedisScriptMissing."""
    out: dict[str, str] = {}
    for name in names:
        path = folder / f"{name}{SUFFIX}"
        if not path.is_file():
            raise RedisScriptMissing(
                f"the Redis script {name}{SUFFIX} is missing from {folder}; the package ships every "
                f"script of asyncdapo.contracts.redis_scripts.RedisScript and LuaPrelude as package "
                f"data (pyproject.toml [tool.setuptools.package-data] '*.lua'): reinstall asyncdapo "
                f"from a complete wheel or checkout"
            )
        out[name] = path.read_text(encoding="utf-8")
    return out


def _bodies() -> dict[str, str]:
    names = [s.value for s in RedisScript] + [p.value for p in LuaPrelude]
    sources = read_sources(importlib.resources.files(__name__), names)
    return {name: strip_header(text) for name, text in sources.items()}


_BODIES: Final = _bodies()
_SCRIPTS: Final[Mapping[RedisScript, str]] = MappingProxyType(
    {s: "".join(_BODIES[p.value] for p in PRELUDES.get(s, ())) + _BODIES[s.value] for s in RedisScript}
)


def script(name: RedisScript) -> str:
    """The text Redis runs for `name` (its preludes, then the script; no header)."""
    return _SCRIPTS[name]


def prelude(name: LuaPrelude) -> str:
    """The text of one prelude (no header), as `script()` prepends it."""
    return _BODIES[name.value]
