"""Weight snapshots are checked against the served checkpoint (names, shapes) from headers only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from asyncdapo.services.gateway.weight_loader import (
    WeightsError,
    WeightsProblem,
    WeightsValidator,
    resolve_uri,
)

TENSORS = {
    "model.embed_tokens.weight": np.zeros((10, 4), np.float32),
    "model.layers.0.mlp.up_proj.weight": np.zeros((8, 4), np.float32),
}


def _snapshot(path: Path, tensors: dict[str, np.ndarray], tied: bool = True, shards: int = 1) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(path / f"model-{i}.safetensors"))
    (path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    return path


def test_identical_layout_fits_even_when_sharded_and_in_another_float_dtype(tmp_path: Path) -> None:
    validator = WeightsValidator(_snapshot(tmp_path / "served", TENSORS))
    half = {k: v.astype(np.float16) for k, v in TENSORS.items()}
    path, n = validator.check(str(_snapshot(tmp_path / "new", half, shards=2)))
    assert n == 2 and path == tmp_path / "new"
    assert validator.check("file://" + str(tmp_path / "new"))[1] == 2


def test_tied_lm_head_is_tolerated_only_for_tied_models(tmp_path: Path) -> None:
    extra = {**TENSORS, "lm_head.weight": np.zeros((10, 4), np.float32)}
    assert WeightsValidator(_snapshot(tmp_path / "tied", TENSORS)).check(
        str(_snapshot(tmp_path / "a", extra))
    )
    untied = WeightsValidator(_snapshot(tmp_path / "untied", TENSORS, tied=False))
    with pytest.raises(WeightsError, match=r"1 tensor\(s\) unknown to the served model: lm_head.weight"):
        untied.check(str(_snapshot(tmp_path / "b", extra)))


def test_mismatched_shapes_and_missing_tensors_are_named(tmp_path: Path) -> None:
    validator = WeightsValidator(_snapshot(tmp_path / "served", TENSORS))
    bad = {"model.embed_tokens.weight": np.zeros((11, 4), np.float32)}
    with pytest.raises(WeightsError) as info:
        validator.check(str(_snapshot(tmp_path / "bad", bad)))
    assert info.value.problem is WeightsProblem.MISMATCH
    msg = str(info.value)
    assert "missing 1 tensor(s) of the served model: model.layers.0.mlp.up_proj.weight" in msg
    assert "tensor 'model.embed_tokens.weight' has shape [11, 4], the served model has [10, 4]" in msg


def test_integer_tensor_in_place_of_a_float_one_is_a_mismatch(tmp_path: Path) -> None:
    validator = WeightsValidator(_snapshot(tmp_path / "served", TENSORS))
    ints = {**TENSORS, "model.embed_tokens.weight": np.zeros((10, 4), np.int32)}
    with pytest.raises(WeightsError, match="has dtype I32"):
        validator.check(str(_snapshot(tmp_path / "ints", ints)))


def test_bad_uris(tmp_path: Path) -> None:
    with pytest.raises(WeightsError) as info:
        resolve_uri(str(tmp_path / "nope"))
    assert info.value.problem is WeightsProblem.NOT_FOUND and "uri" in str(info.value)
    with pytest.raises(WeightsError, match="scheme 's3' is not supported"):
        resolve_uri("s3://bucket/x")
    with pytest.raises(WeightsError, match="uri is empty"):
        resolve_uri(" ")
    validator = WeightsValidator(_snapshot(tmp_path / "served", TENSORS))
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError) as info:
        validator.check(str(tmp_path / "empty"))
    assert info.value.problem is WeightsProblem.NO_SAFETENSORS


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("/" + "a" * 70_000, "File name too long"),  # one name past NAME_MAX, the whole past PATH_MAX
        ("file://" + "x/" * 3000, "File name too long"),  # short names, the whole past PATH_MAX
        ("snapshots/v1\x00", "NUL"),
        ("file://", "names no path"),  # not the gateway's working directory
    ],
)
def test_a_uri_no_path_can_have_is_a_bad_uri_with_a_short_message(uri: str, why: str) -> None:
    with pytest.raises(WeightsError) as info:
        resolve_uri(uri)
    assert info.value.problem is WeightsProblem.BAD_URI and why in str(info.value)
    assert len(str(info.value)) < 300  # the uri is echoed cut, not whole


def test_corrupt_header_is_reported(tmp_path: Path) -> None:
    validator = WeightsValidator(_snapshot(tmp_path / "served", TENSORS))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(WeightsError) as info:
        validator.check(str(tmp_path / "junk"))
    assert info.value.problem is WeightsProblem.CORRUPT
