"""The process supervisor (local stack and fault harness): readiness, failure naming, restarts,
signals to whole process groups, and no orphan processes."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncdapo.tools.local.ports import free_port, port_open
from asyncdapo.tools.local.supervisor import (
    CRASH_BACKOFF,
    Restart,
    RestartEvent,
    ServiceFailed,
    ServiceSpec,
    Supervisor,
    group_members,
)


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


# --- the children the fault harness drives: restarts, signals to the whole group, the reaper ---


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_crash_backoff_doubles_from_one_second_up_to_ten() -> None:
    assert [CRASH_BACKOFF.delay(n) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_crashed_child_restarts_after_the_backoff_with_the_same_argv(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    events: list[tuple[str, RestartEvent, str]] = []
    script = "import os, sys; open(sys.argv[1], 'a').write(f'{os.getpid()} {sys.argv[2]}\\n'); sys.exit(1)"
    with Supervisor(
        tmp_path / "logs", banner="fault harness", on_restart=lambda c, e, d: events.append((c.name, e, d))
    ) as sup:
        child = sup.start(
            ServiceSpec(
                "gw", [sys.executable, "-c", script, str(starts), "port=4711"], restart=Restart.ON_CRASH
            )
        )
        _wait(lambda: child.exited() is not None)
        sup.check()  # a child the supervisor restarts is no failure
        t0 = 1000.0
        sup.restart_crashed(now=t0)
        assert [(n, e) for n, e, _ in events] == [("gw", RestartEvent.CRASHED)]
        assert "exit code 1" in events[0][2] and "gw.log" in events[0][2]
        sup.restart_crashed(now=t0 + 0.9)
        assert child.starts == 1
        sup.restart_crashed(now=t0 + 1.0)
        assert child.starts == 2 and events[-1][:2] == ("gw", RestartEvent.STARTED)
        _wait(lambda: child.exited() is not None)
        # a second crash in a row waits twice as long
        t1 = 2000.0
        sup.restart_crashed(now=t1)
        sup.restart_crashed(now=t1 + 1.9)
        assert child.starts == 2
        sup.restart_crashed(now=t1 + 2.0)
        assert child.starts == 3
        _wait(lambda: child.exited() is not None)
    lines = starts.read_text().splitlines()
    assert len(lines) == 3 and len({line.split()[0] for line in lines}) == 3  # three processes
    assert {line.split()[1] for line in lines} == {"port=4711"}  # one argv
    assert (tmp_path / "logs" / "gw.log").read_text().count("===== fault harness: start #") == 3


def test_a_finished_job_and_a_held_child_stay_down_until_released(tmp_path: Path) -> None:
    events: list[RestartEvent] = []
    with Supervisor(tmp_path / "logs", on_restart=lambda c, e, d: events.append(e)) as sup:
        job = sup.start(
            ServiceSpec("trainer", [sys.executable, "-c", "pass"], may_exit=True, restart=Restart.ON_CRASH)
        )
        held = sup.start(
            ServiceSpec("redis", [sys.executable, "-c", "import sys; sys.exit(2)"], restart=Restart.ON_CRASH)
        )
        held.held = True
        _wait(lambda: job.exited() == 0 and held.exited() == 2)
        sup.restart_crashed(now=1e9)
        assert events == [] and job.starts == 1 and held.starts == 1
        held.release()
        sup.restart_crashed(now=1e9)
        sup.restart_crashed(now=1e9 + 1.0)
        assert events == [RestartEvent.CRASHED, RestartEvent.STARTED] and held.starts == 2


def test_the_restart_loop_runs_by_itself(tmp_path: Path) -> None:
    script = "import sys, time; time.sleep(0.2); sys.exit(1)"
    with Supervisor(tmp_path / "logs") as sup:
        child = sup.start(ServiceSpec("flaky", [sys.executable, "-c", script], restart=Restart.ON_CRASH))
        sup.start_restarts()
        _wait(lambda: child.starts >= 2, timeout_s=15)
    assert child.exited() is not None  # close() stopped it and the loop


def test_pause_resume_terminate_and_kill_reach_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    # the main process exits 7 on SIGTERM; its grandchild ignores SIGTERM
    script = (
        "import signal, subprocess, sys, time;"
        "g = subprocess.Popen([sys.executable, '-c',"
        " 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']);"
        "open(sys.argv[1], 'w').write(str(g.pid));"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7));"
        "time.sleep(60)"
    )
    with Supervisor(tmp_path / "logs") as sup:
        child = sup.start(ServiceSpec("svc", [sys.executable, "-c", script, str(pidfile)]))
        _wait(lambda: pidfile.exists() and pidfile.read_text() != "")
        pgid = child.pid
        assert pgid is not None
        members = group_members(pgid)
        assert len(members) == 2
        child.pause()
        _wait(lambda: all(_state(p) == "T" for p in members))
        child.resume()
        _wait(lambda: all(_state(p) != "T" for p in members))
        child.pause()  # terminating a paused child continues it, so that it acts on the SIGTERM
        assert child.terminate(grace_s=5.0) == 7
        assert group_members(pgid) == []
        pidfile.unlink()
        child.start()  # again, the same argv
        _wait(lambda: pidfile.exists() and pidfile.read_text() != "")
        assert child.pid != pgid and child.running()
        with pytest.raises(ServiceFailed, match="'svc' is already running"):
            child.start()
        again = child.pid
        assert again is not None and len(group_members(again)) == 2
        child.kill()
        assert group_members(again) == [] and child.exited() == -signal.SIGKILL


def test_the_reaper_stops_the_children_of_a_killed_supervisor_restarts_included(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # a supervisor that starts a child, kills it, starts it again, then waits to be killed itself
    script = (
        "import sys, time;"
        "from pathlib import Path;"
        "from asyncdapo.tools.local.supervisor import ServiceSpec, Supervisor;"
        "sup = Supervisor(Path(sys.argv[1]));"
        "c = sup.start(ServiceSpec('sleeper', [sys.executable, '-c', 'import time; time.sleep(60)']));"
        "c.kill(); c.start();"
        "Path(sys.argv[2]).write_text(f'{c.pid}');"
        "time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "logs"), str(pidfile)])
    try:
        _wait(lambda: pidfile.exists() and pidfile.read_text() != "", timeout_s=30)
        child = int(pidfile.read_text())
        assert _alive(child)
        proc.kill()
        proc.wait()
        _wait(lambda: not _alive(child), timeout_s=10)  # SIGTERM at once: a sleeper dies of it
    finally:
        if proc.poll() is None:
            proc.kill()
