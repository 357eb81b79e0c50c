"""The whole loop on one machine: Redis, verifier, G gateways (vLLM), scheduler and trainer as
supervised subprocesses on 127.0.0.1 with free ports.

Start order follows the dependencies (Redis → verifier → gateways → scheduler → trainer); each
waits for the previous to be ready. The trainer is the only child allowed to exit (0 = all steps
done); any other exit stops the stack with a message naming the service and its log.

Secrets live in `RUN_DIR/secrets` (mode 0700, files 0600), made once per run directory and kept
for `--resume`: the Redis password (redis-server gets `requirepass`, the services get it in
`ASYNCDAPO_REDIS_PASSWORD`) and the bearer token of the control RPCs (scheduler and gateways
require it, the trainer and `asyncdapo up` send it). A Redis given with `--redis-url` is the
user's: its password, if any, comes from the environment or `--redis-password-file`.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from asyncdapo.contracts.config import ModelDtype, RunConfig
from asyncdapo.runtime.redis_conn import PASSWORD_ENV
from asyncdapo.runtime.secret_files import ensure_secret
from asyncdapo.tools.local.ports import free_port
from asyncdapo.tools.local.redis_server import RedisServer
from asyncdapo.tools.local.supervisor import ServiceSpec, Supervisor

RUN_DIR_ENV = "ASYNCDAPO_RUN_DIR"


@dataclass
class StackOptions:
    config_path: Path
    run_dir: Path
    gateways: int = 2
    pools: list[str] = field(default_factory=list)  # each gateway's --pool label (local/pools.py); [] = none
    max_concurrency: int | None = None  # each gateway's --max-concurrency (None: the gateway's default)
    verifier_workers: int = 1
    redis_url: str | None = None  # use this Redis instead of launching one
    redis_maxmemory: str | None = None  # the launched Redis' maxmemory (noeviction); None: no cap
    engine: str = "vllm"
    max_model_len: int | None = None  # None: data.max_prompt_length + data.max_response_length
    gateway_ready_timeout_s: float = 300.0
    step_logs: bool = False  # vllm: each gateway writes logs/gateway-N.steps.jsonl (one line per step)
    response_logs: bool = False  # the scheduler writes logs/<name>.responses.jsonl (every training response)
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class StackEndpoints:
    redis_url: str = ""
    redis_password: str | None = None  # of the Redis the stack launched (None: the user's Redis)
    token: str = ""  # bearer token of the scheduler's and gateways' control RPCs
    verifier_url: str = ""
    gateways: list[str] = field(default_factory=list)
    scheduler: str = ""
    metrics_ports: dict[str, int] = field(default_factory=dict)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "asyncdapo.cli", *args]


def http_ready(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=1.0).status_code == 200


def grpc_ready(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        # types-grpcio-health-checking's HealthStub lacks the Check its __init__ sets
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)  # type: ignore[attr-defined]
        return resp.status == health_pb2.HealthCheckResponse.SERVING


class LocalStack:
    """Starts and owns the local services; use as a context manager so everything stops."""

    def __init__(self, cfg: RunConfig, opts: StackOptions) -> None:
        self.cfg = cfg
        self.opts = opts
        if opts.pools and len(opts.pools) != opts.gateways:
            raise ValueError(f"{len(opts.pools)} pool labels for {opts.gateways} gateways")
        self.run_dir = Path(opts.run_dir)
        self.logs = self.run_dir / "logs"
        # Every service (and whatever it spawns) inherits this marker, so a check can find any
        # process of this run that outlived the stack.
        self.sup = Supervisor(self.logs, env={RUN_DIR_ENV: str(self.run_dir.resolve())})
        self.redis: RedisServer | None = None
        self.ep = StackEndpoints()
        # a prompt of max_prompt_length tokens must fit with a whole response
        self.max_model_len = opts.max_model_len or cfg.data.max_prompt_length + cfg.data.max_response_length
        self._model_dir: str | None = None
        self.token_file = self.run_dir / "secrets" / "token"
        self.ep.token = ensure_secret(self.token_file)

    @property
    def model_dir(self) -> str:
        """model.path as a local directory (a Hub id resolved once through the Hugging Face cache)."""
        if self._model_dir is None:
            from asyncdapo.runtime.models import resolve_model

            self._model_dir = resolve_model(self.cfg.model.path, "model.path")
        return self._model_dir

    # --- lifecycle ---

    def start(self, on_stage=lambda stage: None, scheduler: bool = True) -> StackEndpoints:
        """Everything but the trainer; the trainer (which feeds the prompt queue) starts with
        `start_trainer`, so the policy can be measured before any update. `scheduler=False` leaves
        the scheduler out too (a benchmark then runs one scheduler and trainer per run on the same
        gateways: `start_scheduler`, `start_trainer`, `stop_service`)."""
        on_stage("redis")
        self._start_redis()
        on_stage("verifier")
        self._start_verifier()
        pools = f", pools {','.join(self.opts.pools)}" if self.opts.pools else ""
        on_stage(f"{self.opts.gateways} gateway(s) ({self.opts.engine}{pools})")
        self._start_gateways()
        if scheduler:
            on_stage("scheduler")
            self._start_scheduler()
        return self.ep

    def start_scheduler(self, config_path: Path | None = None, name: str = "scheduler") -> None:
        self._start_scheduler(config_path, name)

    def start_trainer(
        self, config_path: Path | None = None, out_dir: Path | None = None, name: str = "trainer"
    ) -> None:
        self._start_trainer(config_path, out_dir, name)

    def stop_service(self, name: str) -> None:
        """Stop one service (SIGTERM, then SIGKILL after the grace period) and forget it."""
        self.sup.stop(name)

    def stop(self) -> None:
        self.sup.stop_all()
        if self.redis is not None:
            self.redis.stop()
            if self.redis.proc is not None:
                self.sup.unwatch(self.redis.proc.pid)
        self.sup.close()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- services ---

    def _start_redis(self) -> None:
        if self.opts.redis_url:
            self.ep.redis_url = self.opts.redis_url
            return
        password = ensure_secret(self.run_dir / "secrets" / "redis-password")
        self.redis = RedisServer(
            self.run_dir / "redis",
            password=password,
            env=dict(self.sup.env),
            maxmemory=self.opts.redis_maxmemory,
        )
        self.redis.start()
        assert self.redis.proc is not None
        self.sup.watch(self.redis.proc.pid)  # its own process group: stopped if we are killed
        self.sup.env[PASSWORD_ENV] = password  # every service started from now on
        self.ep.redis_url = self.redis.url
        self.ep.redis_password = password

    def _start_verifier(self) -> None:
        port = free_port()
        self.ep.verifier_url = f"http://127.0.0.1:{port}"
        self.ep.metrics_ports["verifier"] = port
        self.sup.start(
            ServiceSpec(
                "verifier",
                _cli(
                    "verifier",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--workers",
                    str(self.opts.verifier_workers),
                ),
                ready=lambda: http_ready(f"{self.ep.verifier_url}/readyz"),
                ready_timeout_s=120,
            )
        )

    def _start_gateways(self) -> None:
        cores = sorted(os.sched_getaffinity(0))  # the cores this stack may use (a cpuset may limit them)
        for i in range(self.opts.gateways):
            core = str(cores[i % len(cores)])
            port, mport = free_port(), free_port()
            address = f"127.0.0.1:{port}"
            self.ep.gateways.append(address)
            self.ep.metrics_ports[f"gateway-{i}"] = mport
            argv = self.gateway_argv(i, port, mport, core)
            # One core per engine: two engines side by side run well only when pinned apart.
            env = {
                "VLLM_CPU_OMP_THREADS_BIND": core,
                "VLLM_CPU_KVCACHE_SPACE": "1",
                **self.opts.extra_env,
            }
            self.sup.start(
                ServiceSpec(
                    f"gateway-{i}",
                    argv,
                    ready=functools.partial(grpc_ready, address),
                    ready_timeout_s=self.opts.gateway_ready_timeout_s,
                    env=env,
                )
            )

    def gateway_argv(self, i: int, port: int, mport: int, core: str) -> list[str]:
        """The command line of gateway `i` (its pool label, pinning and engine flags)."""
        argv = _cli(
            "gateway", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(mport),
            "--engine", self.opts.engine, "--gateway-id", f"gateway-{i}",
            "--token-file", str(self.token_file),
        )  # fmt: skip
        if self.opts.pools and self.opts.pools[i]:
            argv += ["--pool", self.opts.pools[i]]
        if self.opts.max_concurrency is not None:
            argv += ["--max-concurrency", str(self.opts.max_concurrency)]
        if self.opts.engine == "vllm":
            argv += ["--model", self.model_dir, "--max-model-len", str(self.max_model_len)]
            argv += [
                "--enforce-eager",
                "--dtype",
                "float32" if self.cfg.model.dtype is ModelDtype.AUTO else self.cfg.model.dtype.value,
            ]
            if self.opts.gateways > 1:
                # The whole engine (frontend, engine core, worker) on its core, not only the
                # worker: a floating engine core that lands on another engine's core starves
                # that engine's pinned worker (gateway/affinity.py has the figures). A lone
                # engine keeps the other cores for its engine core and frontend.
                argv += ["--cpu-affinity", core]
                # pinned, the model can run in the engine-core process: no per-step hand-off
                # to a worker process (15-20 % less rollout time per step on 2 cores)
                argv += ["--vllm-executor", "uni"]
            if self.opts.step_logs:
                argv += ["--step-log", str(self.logs / f"gateway-{i}.steps.jsonl")]
        return argv

    def _start_scheduler(self, config_path: Path | None = None, name: str = "scheduler") -> None:
        port, mport = free_port(), free_port()
        self.ep.scheduler = f"127.0.0.1:{port}"
        self.ep.metrics_ports["scheduler"] = mport
        self.sup.start(
            ServiceSpec(
                name,
                _cli(
                    "scheduler",
                    "--config",
                    str(config_path or self.opts.config_path),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--metrics-port",
                    str(mport),
                    "--redis",
                    self.ep.redis_url,
                    "--verifier",
                    self.ep.verifier_url,
                    "--gateways",
                    ",".join(self.ep.gateways),
                    "--token-file",
                    str(self.token_file),
                    "--start",
                    *(
                        ["--response-log", str(self.logs / f"{name}.responses.jsonl")]
                        if self.opts.response_logs
                        else []
                    ),
                ),
                ready=lambda: grpc_ready(self.ep.scheduler),
                ready_timeout_s=120,
            )
        )

    def _start_trainer(
        self, config_path: Path | None = None, out_dir: Path | None = None, name: str = "trainer"
    ) -> None:
        mport = free_port()
        self.ep.metrics_ports["trainer"] = mport
        self.sup.start(
            ServiceSpec(
                name,
                _cli(
                    "trainer",
                    "--config",
                    str(config_path or self.opts.config_path),
                    "--redis",
                    self.ep.redis_url,
                    "--scheduler",
                    self.ep.scheduler,
                    "--token-file",
                    str(self.token_file),
                    "--metrics-port",
                    str(mport),
                    "--out",
                    str(out_dir or self.run_dir / "trainer"),
                ),
                may_exit=True,
                env={"OMP_NUM_THREADS": "1"},
            )
        )

    # --- state ---

    def trainer_finished(self, name: str = "trainer") -> bool:
        return self.sup.get(name).exited() == 0

    def check(self) -> None:
        self.sup.check()
