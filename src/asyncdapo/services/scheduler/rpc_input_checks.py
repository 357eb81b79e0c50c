"""Checks of the scheduler's RPC inputs at the service boundary: pure, each refusal naming the
field, what was given and what is allowed (the service answers INVALID_ARGUMENT with it).

What a request can break past this boundary, and is therefore refused here:
- a weight version whose valid-group bound floor((v + 1 + s) * B) is past what floating point
  counts in steps of one (2**53) — and soon past RunStatus' int64: once published (and persisted
  in Redis) every status call would fail;
- a weights uri no gateway can read by its form (blank, a NUL, an unknown scheme, a malformed
  stream:// address, longer than any path);
- evaluation sampling and token ids the gateways refuse by their form: sent anyway, every try on
  every gateway fails and the caller would learn only that the gateways were unavailable.

Echoes of the caller's input go through `runtime.status_details.shown`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.v1 import common_pb2
from asyncdapo.runtime.status_details import shown
from asyncdapo.runtime.weight_stream.uri import SCHEME as STREAM_SCHEME
from asyncdapo.runtime.weight_stream.uri import stream_address

MAX_URI_CHARS = 4096  # PATH_MAX: no directory a gateway can load has a longer name
EXACT_FLOAT = 2**53  # every integer up to here is a float, and fits an int64


class RequestError(ValueError):
    """An RPC input out of bounds: INVALID_ARGUMENT with this message."""


def largest_version(cfg: RunConfig) -> int:
    """The largest weight version whose valid-group bound floor((v + 1 + s) * B) this run can count
    and report: (v + 1 + s) * B at most 2**53. Versions count weight updates, so no run meets it."""
    return math.floor(EXACT_FLOAT / cfg.data.train_batch_size - 1 - cfg.rollout.max_staleness)


def check_publish(version: int, uri: str, cfg: RunConfig) -> None:
    """Raise RequestError naming the first PublishWeights field out of bounds."""
    if version <= 0:
        raise RequestError(f"version must be > 0 (versions count weight updates: 1, 2, …), got {version}")
    most = largest_version(cfg)
    if version > most:
        raise RequestError(
            f"version {version} is out of range: this run (train_batch_size "
            f"{cfg.data.train_batch_size}, max_staleness {cfg.rollout.max_staleness}) counts its "
            f"valid-group bound floor((v + 1 + s) * B) up to version {most}; versions count weight "
            "updates: 1, 2, …"
        )
    if not uri.strip():
        raise RequestError(
            "uri is required: a directory of safetensors files, file://PATH or stream://HOST:PORT"
        )
    if len(uri) > MAX_URI_CHARS:
        raise RequestError(f"uri is {len(uri)} characters long, at most {MAX_URI_CHARS} (a path's limit)")
    if "\x00" in uri:
        raise RequestError(f"uri {shown(uri)} contains a NUL character, which no path can")
    if "://" in uri:
        scheme = uri.partition("://")[0]
        if uri.startswith(STREAM_SCHEME):
            try:
                stream_address(uri)
            except ValueError as err:
                raise RequestError(str(err)) from None
        elif scheme != "file":
            raise RequestError(
                f"uri {shown(uri)}: scheme {shown(scheme)} is not supported; use a directory path, "
                "file://PATH or stream://HOST:PORT"
            )


def _check_ids(ids: Sequence[int], field: str) -> None:
    if ids and min(ids) < 0:
        i = next(i for i, t in enumerate(ids) if t < 0)
        raise RequestError(f"{field}[{i}] = {ids[i]}: token ids are >= 0")


def check_eval_sampling(s: common_pb2.SamplingParams) -> None:
    """Raise RequestError naming the first field of an evaluation's sampling (the run's validation
    sampling with the request's fields over it) that every gateway would refuse."""
    if s.max_tokens <= 0:
        raise RequestError(f"sampling.max_tokens must be > 0, got {s.max_tokens}")
    if s.HasField("temperature") and not (math.isfinite(s.temperature) and s.temperature >= 0.0):
        raise RequestError(f"sampling.temperature must be a finite number >= 0, got {s.temperature}")
    if s.HasField("top_p") and not (math.isfinite(s.top_p) and 0.0 < s.top_p <= 1.0):
        raise RequestError(f"sampling.top_p must be in (0, 1], got {s.top_p}")
    if s.HasField("top_k") and s.top_k < -1:
        raise RequestError(f"sampling.top_k must be -1 or 0 (disabled) or >= 1, got {s.top_k}")
    _check_ids(s.stop_token_ids, "sampling.stop_token_ids")


def check_eval_prompt_ids(ids: Sequence[int], index: int) -> None:
    """Raise RequestError when an evaluation prompt's token ids cannot be in any vocabulary."""
    _check_ids(ids, f"prompts[{index}].prompt_token_ids")
