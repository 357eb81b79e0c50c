"""`asyncdapo gateway`: run one rollout gateway (vLLM engine, or the token-timing simulator)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.runtime.backoff import Backoff

# `--weights-from`: the wait between fetches while the trainer serves no weights yet: 1 s, doubled, at most 30 s
START_WEIGHTS_BACKOFF = Backoff(1.0, 30.0)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gateway",
        help="rollout gateway: a vLLM engine (or the token-timing SIMULATOR) behind gRPC",
        description="Serve asyncdapo.v1.Gateway with an in-process vLLM AsyncLLM (--engine vllm) or a "
        "token-timing simulator for scale tests (--engine sim; runs no model).",
    )
    p.add_argument(
        "--model",
        help="Hugging Face model directory or Hub id, e.g. Qwen/Qwen3-8B, found in the Hugging Face cache "
        "(required for --engine vllm)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address for gRPC and metrics (0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=50051, help="gRPC port")
    p.add_argument("--metrics-port", type=int, default=9400, help="Prometheus port (0: no metrics server)")
    p.add_argument(
        "--engine", choices=("vllm", "sim"), default="vllm", help="vllm, or sim: the token-timing simulator"
    )
    p.add_argument("--token-file", help="file holding the bearer token control RPCs must present")
    p.add_argument(
        "--tls-cert", help="serve gRPC over TLS with this PEM certificate (chain); needs --tls-key"
    )
    p.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    p.add_argument(
        "--max-concurrency", type=int, default=64, help="requests the engine runs at once (capacity)"
    )
    p.add_argument("--pool", default="", help="pool label reported in Load (e.g. fast, heavy)")
    p.add_argument("--gateway-id", default=None, help="id reported in Load (default: the host name)")
    p.add_argument("--initial-version", type=int, default=0, help="policy version of the weights in --model")
    p.add_argument("--drain-timeout-s", type=float, default=30.0, help="SIGTERM: time in-flight requests get")
    p.add_argument("--log-level", default="INFO")
    w = p.add_argument_group("weights (stream://)")
    w.add_argument(
        "--weight-store-dir",
        default="",
        help="where stream:// versions are received and kept for peers (one or two model copies); "
        "default /dev/shm when writable (memory), else the temporary directory",
    )
    w.add_argument(
        "--no-weight-store",
        action="store_true",
        help="refuse stream:// uris and serve no WeightStore (snapshot-only gateways)",
    )
    w.add_argument(
        "--weights-from",
        metavar="HOST:PORT",
        help="start from the trainer's weights: fetch the newest version its WeightStore serves (waiting "
        "for the trainer to come up) and serve it, instead of reading --model from a volume",
    )
    w.add_argument(
        "--weights-tls-ca",
        help="pull stream:// weights over TLS, verifying the trainer's and peers' certificates against this PEM CA",
    )
    p.add_argument(
        "--cpu-affinity",
        default=None,
        metavar="CORES",
        help="pin the gateway and every process it starts (vLLM's engine core and workers) to these "
        "cores, e.g. 1 or 0-3; the local stack gives each engine its own core",
    )
    v = p.add_argument_group("vllm engine")
    v.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    v.add_argument("--dtype", default="auto")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="no torch.compile / CUDA graphs: starts in seconds instead of minutes (default: on for a CPU "
        "host, where compiling took ~70 s; off on a GPU)",
    )
    v.add_argument("--gpu-memory-utilization", type=float, default=None)
    v.add_argument(
        "--kv-cache-gb",
        type=float,
        default=None,
        help="KV-cache size in GiB. Default on a CPU host: what --max-concurrency sequences of "
        "--max-model-len tokens need, at most half of the memory the NUMA node has available after the "
        "weights (vLLM's own default reserves 92%% of the node and fails unless that much is free)",
    )
    v.add_argument(
        "--logprobs-mode",
        default="processed_logprobs",
        choices=("processed_logprobs", "raw_logprobs"),
        help="processed: log-probs after temperature/top-p/top-k, i.e. of the distribution sampled from",
    )
    v.add_argument("--no-prefix-caching", action="store_true")
    v.add_argument(
        "--vllm-shm-spin-s",
        type=float,
        default=None,
        help="how long vLLM's engine processes spin after a step before they sleep "
        "(default: 0.05 on a CPU host, where spinning takes the trainer's cores; vLLM's 1 s elsewhere)",
    )
    v.add_argument(
        "--vllm-shm-recheck-ms",
        type=int,
        default=None,
        help="how often a sleeping vLLM engine process re-checks for work, i.e. what a lost wake-up "
        "costs (default: 20 on a CPU host; vLLM's 5000 elsewhere)",
    )
    v.add_argument(
        "--vllm-executor",
        choices=("mp", "uni"),
        default=None,
        help="uni: run the model inside vLLM's engine-core process (no worker process, no per-step "
        "hand-off; 15-20%% faster rollout on the 2-core local stack); on a CPU host only with "
        "--cpu-affinity (unpinned it stalled). Default: vLLM's choice (mp on CPU)",
    )
    v.add_argument(
        "--step-log",
        metavar="PATH",
        default=None,
        help="append one JSON line per engine step to PATH (time, running, waiting, KV usage, tokens "
        "decoded and prefilled): a timeline of the engine, e.g. for stalls; costs one write per step",
    )
    v.add_argument(
        "--vllm-metrics",
        action="store_true",
        help="also export vLLM's own vllm:* Prometheus metrics (per-token histograms; costs frontend CPU)",
    )
    v.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="extra vLLM AsyncEngineArgs field, value parsed as JSON (repeatable)",
    )
    s = p.add_argument_group("sim engine (token-timing SIMULATOR)")
    s.add_argument("--sim-base-step-ms", type=float, default=10.0, help="decode step time at concurrency 0")
    s.add_argument(
        "--sim-per-seq-step-ms", type=float, default=0.2, help="added step time per running request"
    )
    s.add_argument("--sim-prefill-us-per-token", type=float, default=10.0)
    s.add_argument("--sim-length-dist", choices=("fixed", "uniform", "lognormal"), default="lognormal")
    s.add_argument("--sim-length-mean", type=float, default=200.0, help="mean response length (tokens)")
    s.add_argument(
        "--sim-length-sigma", type=float, default=0.8, help="lognormal sigma / uniform half-width ratio"
    )
    s.add_argument("--sim-reload-ms", type=float, default=200.0)
    s.add_argument(
        "--sim-kv-capacity-tokens",
        type=int,
        default=1 << 20,
        help="KV cache size: requests are admitted while their context fits, and preempted (recomputed) "
        "when decoding would overflow it, as vLLM does",
    )
    s.add_argument("--sim-kv-block-tokens", type=int, default=16, help="KV block size (vLLM's block_size)")
    s.add_argument(
        "--sim-answer-key",
        metavar="FILE",
        default=None,
        help="SIMULATOR answer-key mode: JSON {prompt key: ground truth} (write one with `python -m "
        "asyncdapo.services.gateway.sim_answers`); each response is random filler ending in a boxed answer, so "
        "the real verifier gives groups real variance. Needs --model (its tokenizer.json)",
    )
    s.add_argument(
        "--sim-accuracy",
        type=float,
        default=0.5,
        metavar="P",
        help="SIMULATOR answer-key mode: probability that a response's boxed answer is the ground truth",
    )
    p.set_defaults(func=run)


def _engine_args(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise AsyncdapoError(f"--engine-arg {pair!r}: expected KEY=JSON")
        try:
            out[key.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = raw
    return out


def _check_args(args: argparse.Namespace) -> str | None:
    if args.max_concurrency < 1:
        raise AsyncdapoError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.engine == "vllm" and not (args.model or args.weights_from):
        raise AsyncdapoError(
            "--engine vllm needs --model (a directory or Hub id) or --weights-from HOST:PORT"
        )
    if args.model and args.weights_from:
        raise AsyncdapoError("--model and --weights-from both name the weights to start from: give one")
    if args.sim_answer_key and args.engine != "sim":
        raise AsyncdapoError("--sim-answer-key is a SIMULATOR mode: it needs --engine sim")
    if args.model:
        from asyncdapo.runtime.models import resolve_model

        local = resolve_model(args.model, "--model")  # a Hub id becomes its cached snapshot
        if local != args.model:
            logging.getLogger(__name__).info("--model %s: %s (Hugging Face cache)", args.model, local)
        args.model = local
    if args.vllm_executor == "uni" and args.cpu_affinity is None and args.engine == "vllm" and _on_cpu():
        # measured on 2 cores: the engine core (now doing the model's work) floated onto the other
        # engine's core, and rollout took 8.7 s per step instead of 0.9
        raise AsyncdapoError(
            "--vllm-executor uni on a CPU host needs --cpu-affinity (the engine on its own cores)"
        )
    if args.step_log is not None:
        if args.engine != "vllm":
            raise AsyncdapoError("--step-log is a vllm engine log (the simulator has no engine steps)")
        parent = Path(args.step_log).resolve().parent
        if not parent.is_dir():
            raise AsyncdapoError(f"--step-log {args.step_log!r}: directory {str(parent)!r} does not exist")
    from asyncdapo.runtime.grpc_security import read_token_file

    return None if args.token_file is None else read_token_file(args.token_file)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from asyncdapo.runtime.grpc_security import server_tls_from_args

    token = _check_args(args)
    tls = server_tls_from_args(args)
    if args.cpu_affinity is not None:
        from asyncdapo.services.gateway.affinity import pin

        try:
            cores = pin(args.cpu_affinity)  # checks the list; before any engine process or thread exists
        except ValueError as err:
            raise AsyncdapoError(f"--cpu-affinity {args.cpu_affinity!r}: {err}") from None
        logging.getLogger(__name__).info("pinned to core(s) %s", sorted(cores))
    asyncio.run(_serve(args, token, tls))
    return 0


async def _serve(args: argparse.Namespace, token: str | None, tls: Any) -> None:
    from asyncdapo.services.gateway.gateway_service import GatewayOptions, StreamWeights
    from asyncdapo.services.gateway.metrics import GatewayMetrics
    from asyncdapo.services.gateway.server import GatewayServer, ServerSettings

    weights = None
    if not args.no_weight_store:
        from asyncdapo.runtime.grpc_security import ClientTls
        from asyncdapo.runtime.weight_stream.fetch import Fetcher
        from asyncdapo.runtime.weight_stream.store import WeightStore, remove_orphans

        store = WeightStore(args.weight_store_dir or None, f"gw-{os.getpid()}")
        if not store.root.is_dir():
            raise AsyncdapoError(f"--weight-store-dir {str(store.root)!r} is not a directory")
        remove_orphans(store.root)
        client_tls = (
            ClientTls.from_file(args.weights_tls_ca, "--weights-tls-ca") if args.weights_tls_ca else None
        )
        weights = StreamWeights(store, Fetcher(store, token, client_tls))
    if args.weights_from and weights is None:
        raise AsyncdapoError("--weights-from needs the weight store (drop --no-weight-store)")
    validator = None if args.weights_from else _validator(args)
    server = GatewayServer(
        None,
        GatewayOptions(
            gateway_id=args.gateway_id or socket.gethostname(),
            pool=args.pool,
            capacity=args.max_concurrency,
            initial_version=args.initial_version,
        ),
        ServerSettings(
            host=args.host,
            port=args.port,
            metrics_port=args.metrics_port or None,
            token=token,
            tls=tls,
            drain_timeout_s=args.drain_timeout_s,
        ),
        GatewayMetrics(),
        validator,
        weights,
    )
    # Bind first: the port is ours (health NOT_SERVING) while the engine loads.
    try:
        await server.start()
    except OSError as err:
        raise AsyncdapoError(f"--port {args.port} / --metrics-port {args.metrics_port}: {err}") from None
    try:
        if args.weights_from:  # the port is held (health NOT_SERVING) while the trainer comes up
            args.model, args.initial_version = await _start_weights(weights, args.weights_from)
            server.service.starting_weights(_validator(args), args.initial_version)
        await server.attach(await _build_engine(args))
    except BaseException:
        await server.stop(grace_s=0)
        raise
    await server.serve_until_signal()


def _validator(args: argparse.Namespace) -> Any:
    """The served checkpoint's tensor specs, which every later version must match (None without a
    model: the simulator)."""
    from asyncdapo.services.gateway.weight_loader import WeightsError, WeightsValidator

    if not args.model:
        return None
    try:
        return WeightsValidator(args.model)
    except WeightsError as err:
        if args.engine == "vllm":
            raise AsyncdapoError(f"--model {args.model!r}: {err}") from None
        return None


async def _start_weights(weights: Any, address: str) -> tuple[str, int]:
    """(model directory, version): the newest version `address` serves, fetched into the store;
    waits with capped backoff while the trainer is not up or serves nothing yet."""
    import asyncio

    from asyncdapo.runtime.weight_stream.fetch import FetchError

    log = logging.getLogger(__name__)
    delays = START_WEIGHTS_BACKOFF.delays()
    while True:
        errors: list[str] = []
        try:
            manifest = await weights.fetcher.manifest(-1, [address], errors)
            res = await weights.fetcher.fetch(manifest.version, [address])
            log.info(
                "starting from weights v%d of %s (%.1f MB)",
                manifest.version,
                address,
                res.bytes_received / 1e6,
            )
            return res.directory, manifest.version
        except FetchError as err:
            delay = delays.next()
            log.warning("--weights-from %s: %s; retrying in %.0f s", address, err, delay)
            await asyncio.sleep(delay)


async def _build_engine(args: argparse.Namespace) -> Any:
    if args.engine == "sim":
        from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine

        try:
            timing = SimTiming(
                base_step_s=args.sim_base_step_ms / 1000,
                per_seq_step_s=args.sim_per_seq_step_ms / 1000,
                prefill_s_per_token=args.sim_prefill_us_per_token / 1e6,
                length_dist=args.sim_length_dist,
                length_mean=args.sim_length_mean,
                length_sigma=args.sim_length_sigma,
                reload_s=args.sim_reload_ms / 1000,
                kv_capacity_tokens=args.sim_kv_capacity_tokens,
                kv_block_tokens=args.sim_kv_block_tokens,
            )
        except ValueError as err:
            raise AsyncdapoError(f"simulator settings: {err}") from None
        from asyncdapo.services.gateway.sim_answers import load_answer_key

        answer_key = load_answer_key(args.sim_answer_key) if args.sim_answer_key else None
        try:
            return SimulatedEngine(
                timing,
                max_concurrency=args.max_concurrency,
                model_dir=args.model,
                initial_version=args.initial_version,
                seed=args.seed,
                answer_key=answer_key,
                accuracy=args.sim_accuracy,
            )
        except ValueError as err:  # e.g. a KV cache too small for one max_model_len sequence
            raise AsyncdapoError(f"simulator settings: {err}") from None
    from asyncdapo.services.gateway import vllm_shm
    from asyncdapo.services.gateway.vllm_engine import VllmEngine, VllmSettings

    spin, recheck = args.vllm_shm_spin_s, args.vllm_shm_recheck_ms
    on_cpu = _on_cpu()
    enforce_eager = on_cpu if args.enforce_eager is None else args.enforce_eager
    kv_cache_gb = args.kv_cache_gb
    if on_cpu and kv_cache_gb is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        from asyncdapo.services.gateway.kv_budget import cpu_kv_cache_plan

        plan, node = cpu_kv_cache_plan(args.model, args.dtype, args.max_model_len, args.max_concurrency)
        kv_cache_gb = plan.gib
        logging.getLogger(__name__).info("%s", plan.describe(node))
    if on_cpu:
        spin = vllm_shm.CPU_SPIN_S if spin is None else spin
        recheck = vllm_shm.CPU_RECHECK_MS if recheck is None else recheck
    try:
        vllm_shm.configure(spin, recheck)  # read by our vLLM plugin in the engine processes
    except ValueError as err:
        raise AsyncdapoError(f"--vllm-shm-spin-s / --vllm-shm-recheck-ms: {err}") from None
    return await VllmEngine.start(
        VllmSettings(
            model=args.model,
            max_concurrency=args.max_concurrency,
            max_model_len=args.max_model_len,
            dtype=args.dtype,
            seed=args.seed,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_gb=kv_cache_gb,
            logprobs_mode=args.logprobs_mode,
            enable_prefix_caching=not args.no_prefix_caching,
            initial_version=args.initial_version,
            vllm_metrics=args.vllm_metrics,
            executor=args.vllm_executor,
            step_log=args.step_log,
            extra=_engine_args(args.engine_arg),
        )
    )


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
