"""The Redis Lua scripts live in .lua files (asyncdapo.contracts.redis_scripts), each loaded by name,
documented by its header, and nowhere else: no Python module carries Lua."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncdapo.contracts import redis_scripts as rs
from asyncdapo.contracts.redis_scripts import (
    PRELUDES,
    LuaPrelude,
    RedisScript,
    RedisScriptMissing,
    prelude,
    read_sources,
    script,
    strip_header,
)

SRC = Path(__file__).resolve().parents[2] / "src"
FOLDER = Path(rs.__file__).parent


def _header(name: str) -> list[str]:
    """The leading `--` lines of `<name>.lua`."""
    lines = (FOLDER / f"{name}.lua").read_text().splitlines()
    return lines[: next(i for i, x in enumerate(lines) if not x.startswith("--"))]


def test_every_lua_file_has_a_name_and_every_name_a_file() -> None:
    files = {p.stem for p in FOLDER.iterdir() if p.suffix == ".lua"}
    names = {s.value for s in RedisScript} | {p.value for p in LuaPrelude}
    assert files == names, f"files without a name: {files - names}; names without a file: {names - files}"
    assert not {s.value for s in RedisScript} & {p.value for p in LuaPrelude}
    for s in RedisScript:
        assert "redis.call(" in script(s), s
    for p in LuaPrelude:
        assert prelude(p).strip(), p


def test_each_header_says_what_the_script_takes_returns_and_who_runs_it() -> None:
    for name in [*RedisScript, *LuaPrelude]:
        head = "\n".join(_header(name.value))
        assert head.startswith(f"-- {name.value}"), f"{name}.lua: the header starts with the script's name"
        assert "Called by:" in head or "Prepended by:" in head, f"{name}.lua names no caller"
        if isinstance(name, RedisScript):
            for part in ("KEYS:", "ARGV:", "Returns:"):
                assert f"-- {part}" in head, f"{name}.lua: no `{part}` in its header"


def test_the_preludes_a_header_names_are_the_ones_the_loader_prepends() -> None:
    for s in RedisScript:
        lines = [x for x in _header(s.value) if x.startswith("-- Preludes:")]
        named = re.findall(r"(\w+)\.lua", lines[0]) if lines else []
        assert named == [p.value for p in PRELUDES.get(s, ())], f"{s}.lua header: {lines}"
        assert script(s) == "".join(prelude(p) for p in PRELUDES.get(s, ())) + strip_header(
            (FOLDER / f"{s.value}.lua").read_text()
        )


def test_the_header_is_not_sent_to_redis_but_comments_inside_the_script_are() -> None:
    """Rewording a header changes no SHA; an explanation inside the code stays with the code."""
    for s in RedisScript:
        first = script(s).lstrip("\n").splitlines()[0]
        assert not first.startswith("--"), f"{s}: the script starts with a comment: {first!r}"
        assert _header(s.value)[0] not in script(s)
    assert "-- stored label" in script(RedisScript.SCHEDULER_FINISH)
    assert strip_header("-- a\n-- b\n\nreturn 1\n-- c\n") == "\nreturn 1\n-- c\n"


def test_a_missing_file_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "there.lua").write_text("-- there\nreturn 1\n")
    assert read_sources(tmp_path, ["there"]) == {"there": "-- there\nreturn 1\n"}
    with pytest.raises(RedisScriptMissing, match=r"gone\.lua is missing .*package-data"):
        read_sources(tmp_path, ["there", "gone"])


def test_the_scheduler_runs_every_scheduler_script_by_its_short_name() -> None:
    """`ScriptRunner` loads `SCRIPTS` and the fault proxy hashes them: both see the files' text."""
    from asyncdapo.services.scheduler.lua import FINISH, SCRIPTS

    assert {
        s.value.removeprefix("scheduler_"): script(s) for s in RedisScript if s.startswith("scheduler_")
    } == SCRIPTS
    assert script(RedisScript.SCHEDULER_FINISH) == FINISH


def test_no_python_module_under_src_carries_lua() -> None:
    carriers = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "redis.call(" in p.read_text()]
    assert not carriers, f"Lua belongs in asyncdapo/contracts/redis_scripts/*.lua, found in {carriers}"
