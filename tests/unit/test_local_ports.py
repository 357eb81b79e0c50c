"""free_port hands out loopback ports that outgoing connections cannot take before the service binds."""

from __future__ import annotations

import socket

from asyncdapo.tools.local import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_distinct() -> None:
    low = ports.ephemeral_low()
    picked = [ports.free_port() for _ in range(50)]
    assert len(set(picked)) == 50
    assert all(10000 <= p < low for p in picked), (low, picked)


def test_a_port_in_use_is_never_handed_out(monkeypatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        # Force every candidate to be the held port: free_port must refuse it and fall back.
        monkeypatch.setattr(ports, "ephemeral_low", lambda: taken + 1)
        monkeypatch.setattr(ports, "_LOWEST", taken + 1 - 1000)
        monkeypatch.setattr(ports.random.Random, "randrange", lambda self, a, b: taken)
        port = ports.free_port(attempts=5)
    assert port != taken
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_unreadable_range_falls_back_to_linux_default(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_low() == 32768
