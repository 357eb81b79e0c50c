"""`scheduler --tokenizer-from`: a scheduler without a model volume takes tokenizer.json from the
trainer's WeightStore (a real gRPC server, bearer token on) when it first scores — waiting while
the trainer serves nothing yet — and moves that one file only, not the weights."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from asyncdapo.runtime.weight_stream.files import FileNotServed, fetch_files
from asyncdapo.runtime.weight_stream.store import WeightStore
from asyncdapo.runtime.weight_stream.store_server import WeightStoreServer
from asyncdapo.services.scheduler.score_batcher import Detokenizer
from asyncdapo.services.scheduler.streamed_tokenizer import StreamedDetokenizer
from asyncdapo.tools.local.ports import free_port

TOKEN = "run-token"


def _model_copy(src: Path, dest: Path, tokenizer: bool = True) -> Path:
    dest.mkdir()
    for f in src.iterdir():
        if f.is_file() and (tokenizer or not f.name.startswith("tokenizer")):
            shutil.copyfile(f, dest / f.name)
    return dest


async def test_the_tokenizer_arrives_once_the_trainer_serves_and_decodes_like_the_local_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()
    store = WeightStore(tmp_path / "store", "trainer")
    address = f"127.0.0.1:{free_port()}"
    server = WeightStoreServer(store, address, TOKEN)
    server.start()
    try:
        detok = StreamedDetokenizer(address, tmp_path / "fetched", TOKEN, first_backoff_s=0.05)
        waiting = asyncio.create_task(detok.ready())
        await asyncio.sleep(0.5)
        assert not waiting.done()  # nothing served yet: it waits, it does not fail
        store.hold_complete(3, _model_copy(tiny_model_dir, tmp_path / "v3"))
        await asyncio.wait_for(waiting, 30)
        seqs = [[5, 6, 7, 8], [42]]
        assert detok.decode_batch(seqs) == Detokenizer(tiny_model_dir).decode_batch(seqs)
        # the tokenizer only: the weights stay on the trainer
        assert sorted(p.name for p in (tmp_path / "fetched").iterdir()) == ["tokenizer.json"]
        assert store.bytes_served == (tiny_model_dir / "tokenizer.json").stat().st_size
    finally:
        server.stop()
        store.close()


async def test_a_model_without_a_tokenizer_is_named_and_a_wrong_token_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()
    store = WeightStore(tmp_path / "store", "trainer")
    store.hold_complete(0, _model_copy(tiny_model_dir, tmp_path / "v0", tokenizer=False))
    address = f"127.0.0.1:{free_port()}"
    server = WeightStoreServer(store, address, TOKEN)
    server.start()
    try:
        with pytest.raises(FileNotServed, match=r"weights v0 .* hold no tokenizer\.json"):
            await fetch_files(address, ["tokenizer.json"], tmp_path / "out", TOKEN)
        with pytest.raises(Exception, match="UNAUTHENTICATED"):
            await fetch_files(address, ["config.json"], tmp_path / "out", "wrong")
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    finally:
        server.stop()
        store.close()
