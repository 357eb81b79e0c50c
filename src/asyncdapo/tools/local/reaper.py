"""The local stack's dead-man switch: stops every service when `asyncdapo up` dies without
stopping them (SIGKILL, an OOM kill, a crash in the supervisor itself).

Run as `python -m asyncdapo.tools.local.reaper` by the supervisor, which keeps the write end of this
process's stdin and writes one line per change: `+PGID` when it starts a service in a process
group (session) of its own, `-PGID` once it has stopped it. End of file while groups are still
listed means the supervisor is gone: each listed group gets SIGTERM, and SIGKILL once
`GRACE_S` has passed (so the whole tree is gone within `GRACE_S` plus a moment, whatever a
service does with SIGTERM). A supervisor that stopped everything itself leaves nothing listed,
and the reaper just exits.

The reaper runs in a session of its own (a Ctrl-C at the terminal does not reach it) and ignores
SIGINT and SIGHUP: it ends when its stdin ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

GRACE_S = 5.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of that id that is not ours: not one of our groups any more
        return False
    return True


def _signal(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_groups(groups: set[int], grace_s: float = GRACE_S) -> None:
    for pgid in groups:
        _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
        time.sleep(0.1)
    for pgid in groups:
        _signal(pgid, signal.SIGKILL)


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] == "+" and line[1:].isdigit():
            groups.add(int(line[1:]))
        elif line[:1] == "-" and line[1:].isdigit():
            groups.discard(int(line[1:]))
    live = {g for g in groups if _group_alive(g)}
    if live:
        print(
            f"asyncdapo up is gone without stopping its services: stopping process groups {sorted(live)}",
            file=sys.stderr,
            flush=True,
        )
        stop_groups(live)
    return 0


if __name__ == "__main__":
    sys.exit(main())
