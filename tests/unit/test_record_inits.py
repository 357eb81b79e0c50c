"""Records with a written-out `__init__`: the scheduler's per-response dataclasses.

Why written out: the `__init__` that `dataclasses` generates is Python code made at import time, so
it stays Python even where mypyc compiles the module (the simulator's native build,
asyncdapo.tools.simulate.native), and a compiled caller pays a Python call per object; the
simulator builds each of these once per response, ~1 M of each in a 512-engine run. With all four
generated, that run (async, 50 versions, compiled) took ~9 % more CPU (median 23.6 s against
21.6 s); the per-gateway-update and per-prompt records (`GatewayView`, `Decision`, ~0.4 M and
~0.07 M objects) cost nothing measurable generated and keep the plain dataclass. Written out, the
`__init__` compiles. The price is a second list of the fields, which this test keeps equal to the
dataclass's: same names, order and defaults, every field set.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from asyncdapo.services.scheduler.core_commands import ScoreResponse
from asyncdapo.services.scheduler.group_records import ResponseScore
from asyncdapo.services.scheduler.tasks import Request, Score

WRITTEN_OUT: list[type[Any]] = [ScoreResponse, ResponseScore, Request, Score]


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_a_written_out_init_takes_the_dataclass_fields_in_order_with_their_defaults(cls: type[Any]) -> None:
    init = cls.__init__
    # the class's own code, not the one dataclasses generates (whose code object is "<string>")
    assert inspect.getsourcefile(init) == inspect.getsourcefile(cls), f"{cls.__name__}.__init__ is generated"
    params = list(inspect.signature(init).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, p
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert f.default_factory is dataclasses.MISSING, f"{cls.__name__}.{f.name}: a factory default"
        assert p.default == want and type(p.default) is type(want), (cls.__name__, f.name, p.default, want)


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_a_written_out_init_sets_every_field_from_its_argument(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    values = {f.name: object() for f in fields}  # distinct markers: a swapped pair shows
    obj = cls(*values.values())
    assert {f.name: getattr(obj, f.name) for f in fields} == values
    by_keyword = cls(**values)
    assert all(getattr(by_keyword, name) is v for name, v in values.items())
    assert obj == by_keyword or not cls.__dataclass_params__.eq  # type: ignore[attr-defined]
