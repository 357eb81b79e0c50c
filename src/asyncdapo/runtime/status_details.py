"""Status details a gRPC service sends back, kept within what gRPC carries.

A status' details travel in the trailing metadata: past its size limit (8 KiB soft, 16 KiB hard by
default) the caller gets RESOURCE_EXHAUSTED "received metadata size exceeds ..." instead of the
service's answer. A message that echoes a caller's input (a run name, an address, a uri) can be
made that long by the caller, so echoes go through `shown`, whole messages through
`bounded_details`, and a service ends a call with `abort_call`.
"""

from __future__ import annotations

from typing import NoReturn

import grpc

SHOWN_CHARS = 80  # of an echoed input value
# of a status' details, UTF-8 encoded: gRPC percent-encodes every non-ASCII byte (3 bytes each), so
# 2 KiB stays below the 8 KiB soft limit whatever the characters
DETAILS_BYTES = 2048


def shown(value: str) -> str:
    """`value` quoted for a message, cut to `SHOWN_CHARS` characters (with its full length)."""
    if len(value) <= SHOWN_CHARS:
        return repr(value)
    return f"{value[:SHOWN_CHARS]!r}… ({len(value)} characters)"


def bounded_details(message: str) -> str:
    """`message` cut to `DETAILS_BYTES` bytes of UTF-8 (on a character boundary), saying so."""
    raw = message.encode()
    if len(raw) <= DETAILS_BYTES:
        return message
    return raw[:DETAILS_BYTES].decode(errors="ignore") + f"… (cut; {len(message)} characters in all)"


async def abort_call(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with `code` and `message`, cut to what gRPC's metadata carries."""
    await context.abort(code, bounded_details(message))
