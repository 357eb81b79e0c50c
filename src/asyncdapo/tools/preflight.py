"""Preflight: what a valid run config names must exist before any engine starts.

A config can validate and still name a data file that is not there, a model directory without a
tokenizer, or a Redis nobody runs: each of these used to surface minutes later in one service's
log. These checks take seconds and name every problem in the config's one style
(`field.path: <what was given>; <what is allowed>`, asyncdapo.contracts.config_problems):
- `check_data`: every `data.train_files`/`val_files` file exists and loads (verl layout) with at
  least one example;
- `check_model`: `model.path` is a local model directory (config.json, weights, a tokenizer) or a
  Hugging Face Hub id in the local cache, looked up without the network; the run's context fits
  the model's `max_position_embeddings`, which vLLM would refuse to exceed;
- `check_redis`: the Redis of `asyncdapo up --redis-url` answers PING (with the run's password)
  within a short timeout.
`asyncdapo up` runs all of them before it starts anything; `asyncdapo config check` runs the data
and model checks (`--no-paths` skips them for a config whose paths exist only where it runs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.config_problems import Problem, ProblemKind, render, show
from asyncdapo.contracts.errors import AsyncdapoError

# Any one of these is a tokenizer transformers can load (fast, SentencePiece, BPE, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
LONG_CONTEXT_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"  # vLLM then accepts a context beyond the model's
REDIS_TIMEOUT_S = 2.0


class PreflightError(AsyncdapoError):
    """What a run config names is missing or unusable; the message names every problem."""

    def __init__(self, problems: list[Problem], what: str = "cannot start") -> None:
        super().__init__(render(f"{what}: {len(problems)} problem(s)", problems))
        self.problems = problems


def _where(path: str) -> str:
    """Where a relative path was looked for (services resolve it from their working directory)."""
    return "" if Path(path).is_absolute() else f" (looked for in {Path.cwd()})"


# --- data ---


def check_data(cfg: RunConfig) -> list[Problem]:
    """Every training and validation file exists and loads with at least one example."""
    out: list[Problem] = []
    if not cfg.data.train_files:
        out.append(
            Problem(
                "data.train_files",
                "[] given",
                "at least one training file is needed",
                "list verl-layout parquet or JSONL files (`asyncdapo data --help` makes some)",
                ProblemKind.MISSING,
            )
        )
    for key in ("train_files", "val_files"):
        for i, path in enumerate(getattr(cfg.data, key)):
            problem = _check_data_file(f"data.{key}[{i}]", path, cfg.data.prompt_key)
            if problem is not None:
                out.append(problem)
    return out


def _check_data_file(field: str, path: str, prompt_key: str) -> Problem | None:
    given = f"{show(path)} given"
    p = Path(path).expanduser()
    if not p.is_file():
        what = "a directory, not a file" if p.is_dir() else "no such file" + _where(path)
        return Problem(field, given, what, kind=ProblemKind.NOT_FOUND)
    from asyncdapo.contracts.verl_format import load_examples

    try:
        examples = load_examples([p], prompt_key)
    except ModuleNotFoundError:
        return None  # no reader installed here (a control-plane install): that the file exists will do
    except (AsyncdapoError, ValueError, OSError) as err:  # pyarrow's ArrowInvalid is a ValueError
        return Problem(field, given, f"cannot be loaded: {err}", kind=ProblemKind.UNREADABLE)
    if not examples:
        return Problem(field, given, "holds no examples; at least one is needed", kind=ProblemKind.UNREADABLE)
    return None


# --- model ---


def _cached_snapshot(repo_id: str) -> Path | None:
    """The Hub model's snapshot directory in the local Hugging Face cache, without the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError):  # ValueError: an id the Hub would refuse
        return None


def check_model(
    cfg: RunConfig, *, fetch: bool = False, max_model_len: int | None = None, context: bool = True
) -> list[Problem]:
    """`model.path` is a usable model here. A Hub id missing from the cache is a problem, unless
    `fetch`: then it is downloaded as the services would (`asyncdapo up` asks for that only once
    everything else is fine). `context`: check the engines' context, `max_model_len` (None: the
    prompt and response lengths), against the model's max_position_embeddings."""
    from asyncdapo.runtime.models import ModelNotFound, hub_cache_dir, looks_like_hub_id, resolve_model

    field, text = "model.path", cfg.model.path
    given = f"{show(text)} given"
    p = Path(text).expanduser()
    if p.is_dir():
        directory = p
    elif p.exists():
        return [
            Problem(
                field,
                given,
                "a file; must be a model directory or a Hugging Face Hub id",
                kind=ProblemKind.NOT_FOUND,
            )
        ]
    elif not looks_like_hub_id(text):
        return [
            Problem(
                field,
                given,
                "no such directory" + _where(text) + ", nor a Hugging Face Hub id (owner/name)",
                kind=ProblemKind.NOT_FOUND,
            )
        ]
    else:
        try:
            cached = _cached_snapshot(text)
        except ImportError:
            return [
                Problem(field, given, "not a local directory, and huggingface_hub (which finds a Hub id in "
                        "the Hugging Face cache) is not installed", kind=ProblemKind.NOT_FOUND)
            ]  # fmt: skip
        if cached is not None:
            directory = cached
        elif fetch:
            try:
                directory = Path(resolve_model(text, field))
            except ModelNotFound as err:
                return [Problem(field, given, str(err), kind=ProblemKind.NOT_FOUND)]
        else:
            return [
                Problem(
                    field,
                    given,
                    f"not a local directory{_where(text)}, and the Hugging Face cache ({hub_cache_dir()}) "
                    "does not hold this Hub model",
                    f"download it first (`hf download {text}`); `asyncdapo up` downloads it when the Hub "
                    "can be reached",
                    ProblemKind.NOT_FOUND,
                )
            ]
    problems = _check_model_dir(directory, given)
    if problems or not context:
        return problems
    problem = _context_problem(cfg, directory, max_model_len)
    return [problem] if problem is not None else []


def _check_model_dir(directory: Path, given: str) -> list[Problem]:
    """The files every service loads: config.json, the weights and a tokenizer."""
    field = "model.path"
    names = {f.name for f in directory.iterdir()}
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not any(n.endswith(WEIGHT_SUFFIXES) for n in names):
        missing.append("weights (*.safetensors or *.bin)")
    if not names & set(TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    if missing:
        return [
            Problem(
                field,
                given,
                f"{directory} has no {', no '.join(missing)}: not a whole Hugging Face model directory",
                kind=ProblemKind.UNREADABLE,
            )
        ]
    try:
        json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as err:
        return [
            Problem(
                field, given, f"{directory}/config.json cannot be read: {err}", kind=ProblemKind.UNREADABLE
            )
        ]
    return []


def _context_problem(cfg: RunConfig, directory: Path, max_model_len: int | None) -> Problem | None:
    """vLLM refuses a max_model_len beyond the model's max_position_embeddings (unless told to);
    only checked where the config.json states it plainly (no RoPE scaling, which lengthens it)."""
    hf_config = json.loads((directory / "config.json").read_text())
    if not isinstance(hf_config, dict) or os.environ.get(LONG_CONTEXT_ENV, "").lower() in ("1", "true"):
        return None
    limit = hf_config.get("max_position_embeddings")
    rope = hf_config.get("rope_scaling") or hf_config.get("rope_parameters")
    scaled = isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) not in (None, "default")
    if not isinstance(limit, int) or scaled:
        return None
    d = cfg.data
    total = max_model_len or d.max_prompt_length + d.max_response_length
    if total <= limit:
        return None
    if max_model_len:
        return Problem(
            "--max-model-len",
            f"{max_model_len} given",
            f"must be <= the model's max_position_embeddings ({limit}, {directory}/config.json): vLLM "
            "refuses a longer context",
            f"lower it, or set {LONG_CONTEXT_ENV}=1 if the model handles longer contexts",
            ProblemKind.CONFLICT,
        )
    return Problem(
        "data.max_response_length",
        f"{d.max_response_length} given (+ data.max_prompt_length {d.max_prompt_length} = {total})",
        f"a prompt and its response must fit the model's max_position_embeddings ({limit}, "
        f"{directory}/config.json): vLLM refuses a longer context",
        f"shorten data.max_prompt_length or data.max_response_length, or set {LONG_CONTEXT_ENV}=1 if the "
        "model handles longer contexts",
        ProblemKind.CONFLICT,
    )


def check_paths(cfg: RunConfig, *, fetch: bool = False, max_model_len: int | None = None) -> list[Problem]:
    """The data and model checks (`asyncdapo config check`)."""
    return check_data(cfg) + check_model(cfg, fetch=fetch, max_model_len=max_model_len)


# --- Redis ---


def check_redis(url: str, flag: str = "--redis-url", timeout_s: float = REDIS_TIMEOUT_S) -> list[Problem]:
    """The Redis at `url` answers PING within `timeout_s`, with the password every client of the
    run uses (asyncdapo.runtime.redis_conn)."""
    import redis

    from asyncdapo.runtime.redis_conn import (
        PASSWORD_ENV,
        PASSWORD_FLAG,
        redacted_url,
        redis_password,
        sync_client,
    )

    given = f"{redacted_url(url)} given"
    try:
        client = sync_client(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    except ValueError as err:
        return [Problem(flag, given, f"not a Redis URL ({err}); e.g. redis://host:6379/0")]
    try:
        client.ping()
    except redis.AuthenticationError as err:
        has = "is set" if redis_password() else "is not set"
        return [
            Problem(
                flag,
                given,
                f"Redis refused our credentials ({err})",
                f"the password comes from the URL, {PASSWORD_FLAG} or {PASSWORD_ENV} (which {has})",
                ProblemKind.UNREACHABLE,
            )
        ]
    except (redis.RedisError, OSError) as err:
        return [
            Problem(
                flag,
                given,
                f"no Redis answered PING there within {timeout_s:g} s ({err})",
                f"start Redis there, or leave {flag} out and `asyncdapo up` starts its own",
                ProblemKind.UNREACHABLE,
            )
        ]
    finally:
        client.close()
    return []


def preflight(
    cfg: RunConfig, *, redis_url: str | None = None, max_model_len: int | None = None, engine: str = "vllm"
) -> list[Problem]:
    """Everything `asyncdapo up` needs before it starts a process; a Hub model missing from the
    cache is downloaded only when nothing else is wrong (a run that cannot start never waits for a
    download)."""
    problems = check_data(cfg)
    if redis_url:
        problems += check_redis(redis_url)
    # the simulator (--engine sim) has no context to exceed
    return problems + check_model(
        cfg, fetch=not problems, max_model_len=max_model_len, context=engine == "vllm"
    )
