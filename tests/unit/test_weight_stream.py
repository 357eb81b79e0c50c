"""The weight stream's pure parts: manifests (what a sender may claim), the store's checks on
every chunk, the runs a resumed fetch asks for, and who relays to whom."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from asyncdapo.runtime.weight_stream.fetch import missing_runs
from asyncdapo.runtime.weight_stream.manifest import Manifest, ManifestError, build_manifest
from asyncdapo.runtime.weight_stream.store import ChunkCorrupt, WeightStore
from asyncdapo.runtime.weight_stream.uri import stream_address, stream_uri
from asyncdapo.services.scheduler.relay_plan import resync_sources, tree_sources


def model_dir(root: Path) -> Path:
    d = root / "export"
    d.mkdir()
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    (d / "config.json").write_text("{}")
    (d / ".hidden").write_text("not served")
    return d


def test_manifest_cuts_each_file_into_chunks_that_never_span_two_files(tmp_path: Path) -> None:
    m = build_manifest(model_dir(tmp_path), 3, chunk_bytes=4096)
    assert [(f.name, f.size, f.first_chunk, f.num_chunks) for f in m.files] == [
        ("config.json", 2, 0, 1),
        ("model.safetensors", 10240, 1, 3),
    ]
    assert m.locate(3) == (m.files[1], 8192, 2048)
    assert m.total_bytes == 10242 and m.num_chunks == 4
    assert Manifest.from_pb(m.to_pb()) == m


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda pb: setattr(pb.files[0], "name", "../etc/passwd"), "not a plain file name"),
        (lambda pb: setattr(pb.files[0], "name", ".ssh"), "not a plain file name"),
        (lambda pb: setattr(pb.files[1], "num_chunks", 2), "expected 3"),
        (lambda pb: setattr(pb.files[1], "first_chunk", 2), "out of order"),
        (lambda pb: pb.chunk_sha256.pop(), "SHA-256"),
        (lambda pb: setattr(pb, "chunk_bytes", 0), "chunk_bytes"),
    ],
)
def test_a_manifest_that_could_write_outside_its_directory_or_lie_about_sizes_is_refused(
    tmp_path: Path, edit: object, message: str
) -> None:
    pb = build_manifest(model_dir(tmp_path), 1, chunk_bytes=4096).to_pb()
    edit(pb)  # type: ignore[operator]
    with pytest.raises(ManifestError, match=message):
        Manifest.from_pb(pb)


def test_the_store_writes_only_chunks_that_match_their_digest_and_completes_once(tmp_path: Path) -> None:
    src = WeightStore(tmp_path / "a", "src")
    (tmp_path / "a").mkdir()
    m = src.hold_complete(1, model_dir(tmp_path))
    dst = WeightStore(tmp_path / "b", "dst")
    (tmp_path / "b").mkdir()
    held = dst.begin(m)
    with pytest.raises(ChunkCorrupt, match="chunk 1"):
        dst.write(1, 1, b"x" * 4096)
    assert held.missing() == list(range(m.num_chunks))
    done = [dst.write(1, i, src.read(1, i)) for i in reversed(range(m.num_chunks))]
    assert done[-1] and not any(done[:-1]) and held.complete
    for name in ("model.safetensors", "config.json"):
        assert (dst.directory(1) / name).read_bytes() == (src.directory(1) / name).read_bytes()
    assert dst.begin(m) is held  # the same manifest again: resumed, not restarted
    dst.keep_only(set())
    assert not dst.directory(1).exists()


def test_a_resumed_fetch_asks_for_exactly_the_missing_runs() -> None:
    assert missing_runs(bytearray([1, 0, 0, 1, 0, 1, 1, 0])) == [(1, 2), (4, 1), (7, 1)]
    assert missing_runs(bytearray([1, 1])) == []
    assert missing_runs(bytearray(3)) == [(0, 3)]


@pytest.mark.parametrize("n", [1, 2, 4, 7, 64])
@pytest.mark.parametrize("fanout", [1, 2, 3])
def test_the_relay_tree_caps_what_the_trainer_and_each_gateway_send(n: int, fanout: int) -> None:
    targets = [f"g{i}" for i in range(n)]
    plan = tree_sources(targets, fanout)
    fed_by_trainer = [a for a in targets if not plan[a]]
    assert len(fed_by_trainer) == min(n, fanout)
    children: dict[str, int] = {}
    for a in targets:
        for parent in plan[a]:
            assert targets.index(parent) < targets.index(a)  # a parent starts no later than its child
            children[parent] = children.get(parent, 0) + 1
    assert all(c <= fanout for c in children.values())


def test_resync_sources_are_holders_first_and_bounded() -> None:
    assert resync_sources(["a", "b", "c", "d"]) == ["a", "b", "c"]
    assert resync_sources([]) == []


def test_stream_uris_name_a_host_and_port() -> None:
    assert stream_address(stream_uri("10.0.0.7:50070")) == "10.0.0.7:50070"
    for bad in ("stream://host", "stream://:80", "stream://h:0", "/path", "stream://h:x"):
        with pytest.raises(ValueError):
            stream_address(bad)


def test_digest_tells_two_manifests_of_one_version_apart(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    a = build_manifest(d, 1, chunk_bytes=4096)
    (d / "config.json").write_text('{"x": 1}')
    b = build_manifest(d, 1, chunk_bytes=4096)
    assert a.digest() != b.digest() and hashlib.sha256(b"{}").digest() == a.chunk_sha256[0]


def test_a_store_without_room_for_a_version_says_where_and_how_much(tmp_path: Path) -> None:
    from asyncdapo.runtime.weight_stream.store import StoreFull, check_room

    with pytest.raises(StoreFull, match=r"weight_store_dir.*--weight-store-dir"):
        check_room(tmp_path, 1 << 60, "receiving weights v1")
    check_room(tmp_path, 1, "receiving weights v1")


def test_versions_left_by_dead_processes_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    import os
    import subprocess

    from asyncdapo.runtime.weight_stream.store import remove_orphans

    gone = subprocess.Popen(["true"])  # a process that has exited: its pid is free
    gone.wait()
    for name in (
        f"asyncdapo-gw-{gone.pid}-v3",
        f"asyncdapo-trainer-{os.getpid()}-v1",
        "asyncdapo-g0-v1",
        "other",
    ):
        (tmp_path / name).mkdir()
    assert remove_orphans(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"asyncdapo-trainer-{os.getpid()}-v1", "asyncdapo-g0-v1", "other"]
    )
