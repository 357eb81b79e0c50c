"""`stream://HOST:PORT`: a LoadWeights uri naming the WeightStore a version is pulled from."""

from __future__ import annotations

SCHEME = "stream://"


def is_stream_uri(uri: str) -> bool:
    return uri.startswith(SCHEME)


def stream_uri(address: str) -> str:
    return SCHEME + address


def stream_address(uri: str) -> str:
    """HOST:PORT of a stream uri; ValueError naming the problem otherwise."""
    if not is_stream_uri(uri):
        raise ValueError(f"uri {uri!r} is not a stream uri ({SCHEME}HOST:PORT)")
    address = uri[len(SCHEME) :].rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"uri {uri!r}: expected {SCHEME}HOST:PORT with a port in 1..65535")
    return address
