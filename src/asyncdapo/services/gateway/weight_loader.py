"""Weight snapshots: resolve a LoadWeights uri and check it fits the served model before any change.

Only safetensors headers are read (8-byte little-endian length + JSON), so a check costs
milliseconds and never touches tensor data. The reference is the served model directory's own
checkpoint: the snapshot must hold exactly the same tensor names with the same shapes. Float
dtypes may differ (vLLM casts on load); a float/non-float swap may not.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from asyncdapo.runtime.status_details import shown

_MAX_HEADER_BYTES = 100 * 1024 * 1024
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"})
_MAX_LISTED = 5


class WeightsProblem(StrEnum):
    BAD_URI = "bad_uri"  # not a usable local path (too long, unreadable) / unsupported scheme
    NOT_FOUND = "not_found"  # the directory does not exist
    NO_SAFETENSORS = "no_safetensors"  # the directory holds no *.safetensors
    CORRUPT = "corrupt"  # a header cannot be parsed
    MISMATCH = "mismatch"  # names or shapes differ from the served model


class WeightsError(ValueError):
    def __init__(self, problem: WeightsProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]


def resolve_uri(uri: str) -> Path:
    """A local directory from `uri` (`/path`, `relative/path` or `file:///path`)."""
    if not uri.strip():
        raise WeightsError(WeightsProblem.BAD_URI, "uri is empty")
    if "://" in uri:
        scheme, _, rest = uri.partition("://")
        if scheme != "file":
            raise WeightsError(
                WeightsProblem.BAD_URI, f"uri scheme {shown(scheme)} is not supported (use a path or file://)"
            )
        if not rest.strip():  # Path("") would be the gateway's working directory
            raise WeightsError(WeightsProblem.BAD_URI, f"uri {shown(uri)} names no path (use file:///DIR)")
        uri = rest
    if "\x00" in uri:
        raise WeightsError(
            WeightsProblem.BAD_URI, f"uri {shown(uri)} contains a NUL character, which no path can"
        )
    path = Path(uri)
    try:
        is_dir = path.is_dir()
    except OSError as err:
        # the operating system refuses the name itself (too long, a parent not searchable): no
        # snapshot can be there, whatever the gateway's state; the error's own text repeats the name
        raise WeightsError(
            WeightsProblem.BAD_URI,
            f"uri {shown(str(path))} is not a usable directory path: {err.strerror or type(err).__name__} "
            "(give the directory of a weights snapshot this gateway can read)",
        ) from None
    if not is_dir:  # a name the operating system took: at most PATH_MAX, so it is echoed whole
        raise WeightsError(WeightsProblem.NOT_FOUND, f"uri {str(path)!r} is not an existing directory")
    return path


def read_header(file: Path) -> dict[str, TensorSpec]:
    """Tensor names → specs of one .safetensors file, from its header only."""
    try:
        with file.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise WeightsError(WeightsProblem.CORRUPT, f"{file.name}: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", raw_len)
            if n > _MAX_HEADER_BYTES:
                raise WeightsError(WeightsProblem.CORRUPT, f"{file.name}: header length {n} is implausible")
            header = json.loads(f.read(n))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise WeightsError(
            WeightsProblem.CORRUPT, f"{file.name}: unreadable safetensors header: {err}"
        ) from None
    if not isinstance(header, dict):
        raise WeightsError(WeightsProblem.CORRUPT, f"{file.name}: header is not a JSON object")
    specs: dict[str, TensorSpec] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            specs[name] = TensorSpec(str(entry["dtype"]), tuple(int(d) for d in entry["shape"]))
        except (KeyError, TypeError, ValueError):
            raise WeightsError(
                WeightsProblem.CORRUPT, f"{file.name}: bad header entry for {name!r}"
            ) from None
    return specs


def read_dir(path: Path) -> dict[str, TensorSpec]:
    """All tensors of the *.safetensors files in `path` (shards merged; a duplicate name is an error)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(WeightsProblem.NO_SAFETENSORS, f"uri {str(path)!r} holds no *.safetensors files")
    specs: dict[str, TensorSpec] = {}
    for file in files:
        for name, spec in read_header(file).items():
            if name in specs:
                raise WeightsError(WeightsProblem.CORRUPT, f"tensor {name!r} appears in more than one shard")
            specs[name] = spec
    return specs


def tolerated_extra_names(model_dir: Path) -> frozenset[str]:
    """Names a snapshot may carry beyond the served checkpoint: a tied lm_head (the loader skips it)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return frozenset()
    return frozenset({"lm_head.weight"}) if config.get("tie_word_embeddings") else frozenset()


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(sorted(names)[:_MAX_LISTED]) + more


def compare(
    reference: dict[str, TensorSpec], candidate: dict[str, TensorSpec], tolerated_extra: frozenset[str]
) -> list[str]:
    """Every way `candidate` does not fit `reference` (empty when it fits)."""
    problems: list[str] = []
    missing = [n for n in reference if n not in candidate]
    extra = [n for n in candidate if n not in reference and n not in tolerated_extra]
    if missing:
        problems.append(f"missing {len(missing)} tensor(s) of the served model: {_listed(missing)}")
    if extra:
        problems.append(f"{len(extra)} tensor(s) unknown to the served model: {_listed(extra)}")
    for name, ref in reference.items():
        cand = candidate.get(name)
        if cand is None:
            continue
        if cand.shape != ref.shape:
            problems.append(
                f"tensor {name!r} has shape {list(cand.shape)}, the served model has {list(ref.shape)}"
            )
        elif (cand.dtype in _FLOAT_DTYPES) != (ref.dtype in _FLOAT_DTYPES):
            problems.append(f"tensor {name!r} has dtype {cand.dtype}, the served model has {ref.dtype}")
    return problems


class WeightsValidator:
    """Checks snapshots against the served model directory (its headers are read once)."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self.reference = read_dir(self.model_dir)
        self.tolerated_extra = tolerated_extra_names(self.model_dir)

    def check(self, uri: str) -> tuple[Path, int]:
        """The snapshot directory and its tensor count; raises WeightsError naming what is wrong."""
        path = resolve_uri(uri)
        candidate = read_dir(path)
        problems = compare(self.reference, candidate, self.tolerated_extra)
        if problems:
            raise WeightsError(
                WeightsProblem.MISMATCH,
                f"uri {str(path)!r} does not fit the served model: " + "; ".join(problems),
            )
        return path, len(candidate)
