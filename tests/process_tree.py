"""Process-tree helpers for tests that kill one process and check what it leaves behind (Linux /proc)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # clock ticks after boot: tells a process from a later one that reuses its pid
    comm: str
    cmdline: str


def _stat(pid: int) -> tuple[int, str, int, str] | None:
    """(ppid, state, start time, comm) of `pid`, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19]), comm


def descendants(root: int) -> list[Proc]:
    """Every live process under `root` (children, grandchildren, …), `root` excluded."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[int, str, int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            info[int(entry.name)] = st
            children.setdefault(st[0], []).append(int(entry.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        _ppid, state, start, comm = info[pid]
        todo.extend(children.get(pid, []))
        if state == "Z":
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append(Proc(pid, start, comm, cmd.strip()))
    return out


def alive(p: Proc) -> bool:
    """`p` still runs (the same process, not a zombie, not a newcomer with its pid)."""
    st = _stat(p.pid)
    return st is not None and st[1] != "Z" and st[2] == p.start


def survivors(procs: list[Proc], within_s: float) -> list[Proc]:
    """Those of `procs` still alive after `within_s` (returns early once all are gone)."""
    deadline = time.monotonic() + within_s
    left = [p for p in procs if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if alive(p)]
    return left


def with_env(name: str, value: str) -> list[str]:
    """Command lines of the live processes (zombies aside, this one too) whose environment has
    `name=value`: a marker every process of a run inherits finds what outlived it."""
    marker = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        st = _stat(int(entry.name))
        if marker in environ and st is not None and st[1] != "Z":
            found.append(f"{entry.name}: {cmd.strip()}")
    return found
