"""Secrets kept in files (bearer tokens, the Redis password): read for a flag, written for their
owner only. Locally `asyncdapo up` makes them; in Kubernetes they are Secrets mounted as files."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError


def read_secret(path: str | Path, flag: str) -> str:
    """The secret in `path` (surrounding whitespace stripped). An empty file is an error: an empty
    token or password would turn authentication off without anyone noticing."""
    try:
        value = Path(path).read_text().strip()
    except OSError as err:
        raise AsyncdapoError(f"{flag} {str(path)!r}: {err.strerror}") from None
    if not value:
        raise AsyncdapoError(f"{flag} {str(path)!r} is empty")
    return value


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable and writable by its owner only (also when it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode applies only to a new file
        f.write(text)


def ensure_secret(path: Path) -> str:
    """The secret in `path`, made first (random, URL-safe, file 0600 in a 0700 directory) if absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        write_private(path, secrets.token_urlsafe(32))
    return path.read_text().strip()
