"""Hypothesis strategies for any protobuf request message, built from its descriptor: every field
random (full-range and boundary numbers, NaN/inf floats, empty and huge strings, long repeated
fields, enum values the schema does not define), nested messages down to a depth."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

_F = FieldDescriptor
INT32 = st.integers(-(2**31), 2**31 - 1) | st.integers(-3, 70) | st.sampled_from([2**31 - 1, -(2**31)])
INT64 = st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 70)
TEXT = st.text(max_size=24) | st.sampled_from(
    ["", " ", "127.0.0.1:1", "stream://127.0.0.1:1", "/", "x" * 70_000]
)
SCALARS: dict[int, Any] = {
    _F.TYPE_INT32: INT32, _F.TYPE_SINT32: INT32, _F.TYPE_SFIXED32: INT32,
    _F.TYPE_UINT32: st.integers(0, 2**32 - 1), _F.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    _F.TYPE_INT64: INT64, _F.TYPE_SINT64: INT64, _F.TYPE_SFIXED64: INT64,
    _F.TYPE_UINT64: st.integers(0, 2**64 - 1), _F.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    _F.TYPE_FLOAT: st.floats(width=32), _F.TYPE_DOUBLE: st.floats(),
    _F.TYPE_BOOL: st.booleans(), _F.TYPE_STRING: TEXT, _F.TYPE_BYTES: st.binary(max_size=16),
    _F.TYPE_ENUM: st.integers(-2, 6),  # unknown values included: proto3 enums are open
}  # fmt: skip


def _field(f: FieldDescriptor, depth: int) -> Any:
    if f.type == _F.TYPE_MESSAGE:
        if f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            return st.dictionaries(SCALARS[k.type], _field(v, depth), max_size=3)
        inner = fields(f.message_type, depth - 1) if depth > 0 else st.just({})
        return st.lists(inner, max_size=3) if _repeated(f) else inner
    value = SCALARS[f.type]
    if _repeated(f):  # short lists, or one long one (a huge prompt, a million stop ids)
        return st.lists(value, max_size=6) | st.integers(0, 300_000).map(
            lambda n: [1] * n if f.type != _F.TYPE_STRING else ["a"] * n
        )
    return value


def _repeated(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def fields(desc: Descriptor, depth: int = 2) -> st.SearchStrategy[dict[str, Any]]:
    """A dict of field values for `desc` (each field present or left at its default)."""
    return st.fixed_dictionaries({}, optional={f.name: _field(f, depth) for f in desc.fields})


def messages(cls: type[Message], depth: int = 2, **fixed: Any) -> st.SearchStrategy[Message]:
    """Instances of `cls`; `fixed` replaces some fields' strategies (e.g. a list size cap)."""
    return st.builds(
        lambda kw, over: cls(**{**kw, **over}), fields(cls.DESCRIPTOR, depth), st.fixed_dictionaries(fixed)
    )
