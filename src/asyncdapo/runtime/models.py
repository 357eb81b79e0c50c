"""Model locations: a local Hugging Face directory, or a Hub id (`Qwen/Qwen3-8B`) found through the
Hugging Face cache, wherever a model path is accepted (`model.path`, `--model`).

A Hub id resolves to its snapshot directory in the cache (`HF_HUB_CACHE`, default
~/.cache/huggingface/hub), downloading it first when the cache lacks it and the Hub can be reached.
Without a network the error says how to pre-download. Every service resolves the same id to the
same directory, so the gateways, the scheduler's tokenizer and the trainer load the same files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError

# owner/name, as the Hub spells them (no leading "." or "/", exactly one "/")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelNotFound(AsyncdapoError, FileNotFoundError):
    """Neither a local model directory nor a Hub model that could be found or fetched."""


def looks_like_hub_id(path: str) -> bool:
    return bool(_HUB_ID.match(path)) and ".." not in path


def hub_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def resolve_model(path: str | Path, what: str = "model") -> str:
    """A local directory holding `path`'s model: `path` itself, or a Hub id's cached snapshot."""
    text = str(path)
    p = Path(text).expanduser()
    if p.is_dir():
        return str(p)
    if p.exists():
        raise ModelNotFound(f"{what} {text!r} is a file, not a model directory")
    if not looks_like_hub_id(text):
        raise ModelNotFound(
            f"{what} {text!r} is not a directory (nor a Hugging Face Hub id such as Qwen/Qwen3-8B)"
        )
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:  # a service image without the Hub client
        raise ModelNotFound(
            f"{what} {text!r} is not a local directory, and huggingface_hub (needed to find a Hub id in "
            "the Hugging Face cache) is not installed"
        ) from None
    try:
        return snapshot_download(text, local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    reason = "HF_HUB_OFFLINE is set"
    if not offline:
        try:
            return snapshot_download(text)
        except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
            reason = f"the Hub could not be reached or refused it: {str(err).splitlines()[0]}"
    raise ModelNotFound(
        f"{what} {text!r} is not a local directory, and the Hugging Face cache ({hub_cache_dir()}) does not "
        f"hold the Hub model {text!r} ({reason}). Pre-download it where there is a network: "
        f"`hf download {text}` (or `huggingface-cli download {text}`), then copy that cache here (or "
        f"point HF_HUB_CACHE at it); or pass a local model directory"
    )
