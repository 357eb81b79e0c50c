"""`--cpu-affinity`: core lists parse or are rejected naming the part that is wrong, and pinning
holds for threads that already exist and for what the process starts afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asyncdapo.services.gateway.affinity import parse_cores, pin


@pytest.mark.parametrize(
    ("spec", "cores"),
    [("1", {1}), ("0,2", {0, 2}), ("0-3", {0, 1, 2, 3}), ("0-1, 4", {0, 1, 4}), ("2-2", {2})],
)
def test_core_lists_parse(spec: str, cores: set[int]) -> None:
    assert parse_cores(spec) == cores


@pytest.mark.parametrize("spec", ["", "a", "1-", "-1", "3-1", "1,,2", "0.5"])
def test_bad_core_lists_name_the_wrong_part(spec: str) -> None:
    with pytest.raises(ValueError, match="is not a core id or a range"):
        parse_cores(spec)


def test_a_core_this_process_may_not_use_is_rejected() -> None:
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ValueError, match=rf"core\(s\) \[{missing}\] are not available here \(allowed: "):
        pin(str(missing))


_CHILD = """
import os, subprocess, sys, threading, time
from asyncdapo.services.gateway.affinity import pin
stop = threading.Event()
early = threading.Thread(target=stop.wait)  # exists before pin
early.start()
pin("{core}")
late = threading.Thread(target=stop.wait)
late.start()
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(sorted(os.sched_getaffinity(early.native_id)), sorted(os.sched_getaffinity(late.native_id)), child)
stop.set()
"""


def test_pin_covers_existing_threads_later_threads_and_child_processes() -> None:
    core = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(core=core)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert out == [f"[{core}]"] * 3, out
