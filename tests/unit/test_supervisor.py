"""The local-stack supervisor: readiness, failure naming, and no orphan processes."""

import os
import sys
import time
from pathlib import Path

import pytest

from asyncdapo.tools.local.ports import free_port, port_open
from asyncdapo.tools.local.supervisor import ServiceFailed, ServiceSpec, Supervisor


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_ready_then_stop_kills_the_whole_group(tmp_path: Path) -> None:
    port = free_port()
    # The service spawns a grandchild that ignores SIGTERM: stop_all must still leave nothing.
    script = (
        "import subprocess, sys, http.server, signal;"
        "open(sys.argv[2], 'w').write(str(subprocess.Popen([sys.executable, '-c',"
        " 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']).pid));"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    pidfile = tmp_path / "grandchild.pid"
    sup = Supervisor(tmp_path / "logs")
    sup.start(
        ServiceSpec(
            "web",
            [sys.executable, "-c", script, str(port), str(pidfile)],
            ready=lambda: port_open("127.0.0.1", port),
        )
    )
    assert port_open("127.0.0.1", port)
    for _ in range(50):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    sup.check()
    sup.stop_all(grace_s=1.0)
    assert not port_open("127.0.0.1", port)
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_failure_while_starting_names_service_and_log(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs")
    with pytest.raises(ServiceFailed) as exc:
        sup.start(
            ServiceSpec(
                "verifier",
                [sys.executable, "-c", "import sys; print('boom: bad flag --workers'); sys.exit(3)"],
                ready=lambda: False,
            )
        )
    msg = str(exc.value)
    assert "'verifier'" in msg and "code 3" in msg and "verifier.log" in msg and "boom: bad flag" in msg
    sup.stop_all()


def test_check_reports_a_crash_but_tolerates_a_clean_finish(tmp_path: Path) -> None:
    with Supervisor(tmp_path / "logs") as sup:
        sup.start(ServiceSpec("trainer", [sys.executable, "-c", "pass"], may_exit=True))
        sup.start(ServiceSpec("scheduler", [sys.executable, "-c", "import sys; sys.exit(1)"]))
        time.sleep(1.0)
        with pytest.raises(ServiceFailed, match="'scheduler' exited with code 1"):
            sup.check()


def test_readiness_timeout(tmp_path: Path) -> None:
    with Supervisor(tmp_path / "logs") as sup, pytest.raises(ServiceFailed, match="not ready after"):
        sup.start(
            ServiceSpec(
                "gateway-0",
                [sys.executable, "-c", "import time; time.sleep(30)"],
                ready=lambda: False,
                ready_timeout_s=0.5,
            )
        )


def test_stop_one_service_leaves_the_others_running(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with Supervisor(tmp_path / "logs") as sup:
        a = sup.start(ServiceSpec("a", sleeper))
        b = sup.start(ServiceSpec("b", sleeper))
        sup.stop("a", grace_s=1.0)
        assert not _alive(a.proc.pid) and _alive(b.proc.pid)
        with pytest.raises(KeyError):
            sup.get("a")
        sup.check()  # a stopped service is no failure
        sup.start(ServiceSpec("a", sleeper))  # the name can be used again
        assert sup.get("a").exited() is None
