"""The fault proxy's RESP parser: frames found exactly, however the bytes are split."""

from __future__ import annotations

import hashlib

import pytest

from asyncdapo.tools.faults.proxy import command, evalsha, script_sha
from asyncdapo.tools.faults.resp import (
    RespErrorReply,
    RespParser,
    RespProtocolError,
    command_name,
    encode_command,
)

REPLIES = [
    (b"+OK\r\n", "OK"),
    (b"-ERR unknown command\r\n", RespErrorReply("ERR unknown command")),
    (b":42\r\n", 42),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"*0\r\n", []),
    (b"*2\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n", [b"a", [1, None]]),
    (b"$12\r\nline\r\nbreak!\r\n", b"line\r\nbreak!"),  # CRLF inside a bulk string
    # RESP3
    (b"_\r\n", None),
    (b",3.5\r\n", 3.5),
    (b"#t\r\n", True),
    (b"(12345678901234567890\r\n", 12345678901234567890),
    (b"!9\r\nERR bad x\r\n", RespErrorReply("ERR bad x")),
    (b"=8\r\ntxt:abcd\r\n", b"txt:abcd"),
    (b"%1\r\n+k\r\n:1\r\n", ["k", 1]),
    (b"~2\r\n:1\r\n:2\r\n", [1, 2]),
    (b"|1\r\n+ttl\r\n:3\r\n+OK\r\n", "OK"),  # an attribute travels with its reply: one frame
]


@pytest.mark.parametrize(("raw", "value"), REPLIES)
def test_each_reply_type_whole_and_byte_by_byte(raw: bytes, value: object) -> None:
    frames = RespParser(requests=False).feed(raw)
    assert [(f.raw, f.value) for f in frames] == [(raw, value)]
    parser = RespParser(requests=False)
    got = [f for i in range(len(raw)) for f in parser.feed(raw[i : i + 1])]
    assert [(f.raw, f.value) for f in got] == [(raw, value)] and parser.buffered == 0


def test_a_pipeline_split_anywhere_gives_the_same_frames() -> None:
    cmds = [
        encode_command("SET", "k", "v\r\nwith crlf"),
        encode_command("EVALSHA", "a" * 40, 1, "key", "arg"),
        encode_command("GET", "k"),
    ]
    stream = b"".join(cmds)
    for cut in range(1, len(stream)):
        parser = RespParser(requests=True)
        frames = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        assert [f.raw for f in frames] == cmds, cut
        assert [command_name(f.value) for f in frames] == ["SET", "EVALSHA", "GET"]
        assert frames[0].value == [b"SET", b"k", b"v\r\nwith crlf"]


def test_inline_commands_and_push_frames() -> None:
    frames = RespParser(requests=True).feed(b"PING\r\n\r\nset a  b\n")
    assert [f.value for f in frames] == [[b"PING"], [b"set", b"a", b"b"]]
    push = RespParser(requests=False).feed(b">3\r\n+message\r\n+ch\r\n+hi\r\n:1\r\n")
    assert [f.push for f in push] == [True, False]


def test_garbage_is_a_protocol_error() -> None:
    with pytest.raises(RespProtocolError, match="unknown RESP type"):
        RespParser(requests=False).feed(b"?what\r\n")
    with pytest.raises(RespProtocolError, match="bulk strings"):
        RespParser(requests=True).feed(b"*1\r\n:1\r\n")
    with pytest.raises(RespProtocolError, match="integer"):
        RespParser(requests=False).feed(b"$x\r\n")
    with pytest.raises(RespProtocolError, match="CRLF"):
        RespParser(requests=False).feed(b"$2\r\nabcd\r\n")


def test_predicates_match_the_schedulers_scripts() -> None:
    from asyncdapo.services.scheduler.lua import FINISH

    sha = hashlib.sha1(FINISH.encode()).hexdigest()
    assert script_sha("finish") == sha
    is_finish = evalsha("finish")
    assert is_finish([b"EVALSHA", sha.encode(), b"0"])
    assert is_finish([b"evalsha", sha.upper().encode(), b"0"])
    assert is_finish([b"EVAL", FINISH.encode(), b"0"])
    assert not is_finish([b"EVALSHA", script_sha("claim").encode(), b"0"])
    assert not is_finish([b"GET", sha.encode()])
    assert evalsha(sha)([b"EVALSHA", sha.encode(), b"0"])
    with pytest.raises(KeyError, match="known"):
        evalsha("nope")
    assert command("xack", "HSET")([b"XACK", b"s"]) and not command("XACK")([b"XADD"])
