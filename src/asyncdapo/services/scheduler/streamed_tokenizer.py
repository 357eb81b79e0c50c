"""The scheduler's detokenizer when no model volume is mounted (`scheduler --tokenizer-from`):
`tokenizer.json` comes from the trainer's WeightStore, fetched on first use.

On first use, not at start: the trainer asks the scheduler for the run's policy version before it
serves any weights, so a scheduler that waited for the trainer's weights to start would wait
forever. Responses only exist once gateways run, and gateways start from the trainer's weights —
by the time the first response is scored, the trainer serves them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from asyncdapo.runtime.backoff import Backoff
from asyncdapo.runtime.grpc_security import ClientTls
from asyncdapo.runtime.weight_stream.files import FilesUnavailable, fetch_files
from asyncdapo.services.scheduler.score_batcher import Detokenizer

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
# the wait between fetches while the trainer serves nothing yet: 1 s, doubled, at most 30 s
TOKENIZER_FETCH_BACKOFF = Backoff(1.0, 30.0)


class StreamedDetokenizer:
    """A `Detokenizer` whose tokenizer.json is fetched into `dest` from the WeightStore at
    `address`; `ready()` waits for it (retrying with capped backoff while the trainer is not up
    or serves nothing yet) and must be awaited before `decode_batch`."""

    def __init__(
        self,
        address: str,
        dest: Path,
        token: str | None = None,
        tls: ClientTls | None = None,
        first_backoff_s: float = TOKENIZER_FETCH_BACKOFF.first_s,
    ) -> None:
        self.address = address
        self.dest = dest
        self.token = token
        self.tls = tls
        self.backoff = replace(TOKENIZER_FETCH_BACKOFF, first_s=first_backoff_s)
        self._detok: Detokenizer | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        if self._detok is not None:
            return
        async with self._lock:  # one fetch, however many batches wait for it
            if self._detok is not None:
                return
            delays = self.backoff.delays()
            while True:
                try:
                    version = await fetch_files(
                        self.address, [TOKENIZER_FILE], self.dest, self.token, self.tls
                    )
                    break
                except FilesUnavailable as err:
                    delay = delays.next()
                    log.warning("tokenizer from %s: %s; retrying in %.0f s", self.address, err, delay)
                    await asyncio.sleep(delay)
            log.info("tokenizer of weights v%d from %s", version, self.address)
            self._detok = Detokenizer(self.dest)

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        if self._detok is None:
            raise RuntimeError("StreamedDetokenizer.decode_batch before ready()")
        return self._detok.decode_batch(seqs)
