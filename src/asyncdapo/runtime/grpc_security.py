"""Who may call our gRPC services, over what: the one module both servers (scheduler, gateway) and
every client (scheduler → gateways, trainer → scheduler, `asyncdapo up`) use.

- Bearer token: a server given a token answers UNAUTHENTICATED to any call of one of its control
  methods that lacks `authorization: Bearer <token>` (constant-time comparison), before the handler
  runs; read-only and data-plane methods stay open. Clients send `bearer_metadata(token)`.
- TLS (optional): a server given a certificate and its key (PEM files; in Kubernetes a Secret of
  type kubernetes.io/tls mounted as files) serves TLS only; a client given a CA bundle (the Secret's
  `ca.crt`) verifies the server's certificate against it. Without them both sides speak plaintext,
  which is only fit for 127.0.0.1 or a network policy that admits nothing else.
- Watch streams (`WatchRun`, `WatchLoad`): 0 asks for the server's default interval; anything else
  must lie in [MIN_WATCH_INTERVAL_MS, MAX_WATCH_INTERVAL_MS] or is INVALID_ARGUMENT.

Files are read once, at start; a missing, unreadable or non-PEM file is an AsyncdapoError naming
the flag, not a TLS handshake failure later.
"""

from __future__ import annotations

import argparse
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.runtime.secret_files import read_secret

MIN_WATCH_INTERVAL_MS = 10
MAX_WATCH_INTERVAL_MS = 60_000

ChannelOptions = Sequence[tuple[str, Any]]


# --- bearer token ---------------------------------------------------------------------------


def read_token_file(path: str | Path, flag: str = "--token-file") -> str:
    """The token in `path` (stripped; empty is an error)."""
    return read_secret(path, flag)


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (none without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def method_names(service_full_name: str, methods: Sequence[str]) -> frozenset[str]:
    """gRPC method paths (`/package.Service/Method`) of `methods` of one service."""
    return frozenset(f"/{service_full_name}/{m}" for m in methods)


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on `methods` (full paths, see `method_names`).

    A rejected call gets UNAUTHENTICATED saying whether the token was missing or wrong (never what
    it should be); `on_reject` counts it (a metric)."""

    def __init__(
        self, token: str, methods: frozenset[str], on_reject: Callable[[], None] | None = None
    ) -> None:
        if not token:
            raise ValueError("bearer token is empty")
        self._expected = f"Bearer {token}".encode()
        self._methods = methods
        self._on_reject = on_reject

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method not in self._methods:
            return handler
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization")
        if given is None:
            return self._deny(handler, "missing authorization metadata: send 'authorization: Bearer <token>'")
        if not hmac.compare_digest(str(given).encode(), self._expected):
            return self._deny(handler, "authorization bearer token is wrong")
        return handler

    def _deny(
        self, handler: grpc.RpcMethodHandler[Any, Any], message: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """A handler of the same shape as `handler` that ends the call with UNAUTHENTICATED before
        the servicer sees anything."""
        if self._on_reject is not None:
            self._on_reject()

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
            yield  # pragma: no cover (abort raises): makes this an async generator

        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(deny, **codec)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(deny_stream, **codec)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(deny, **codec)
        return grpc.stream_stream_rpc_method_handler(deny_stream, **codec)


# --- TLS ------------------------------------------------------------------------------------


def _read_pem(path: str | Path, flag: str, marker: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise AsyncdapoError(f"{flag} {str(path)!r}: {err.strerror}") from None
    if b"-----BEGIN " not in data or marker.encode() not in data:
        raise AsyncdapoError(f"{flag} {str(path)!r} holds no PEM {marker.lower()}")
    return data


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and private key (PEM)."""

    cert_chain: bytes
    private_key: bytes

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path) -> ServerTls:
        return cls(_read_pem(cert, "--tls-cert", "CERTIFICATE"), _read_pem(key, "--tls-key", "PRIVATE KEY"))

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)])


@dataclass(frozen=True)
class ClientTls:
    """The CA bundle a client verifies the server's certificate against (PEM)."""

    root_certificates: bytes

    @classmethod
    def from_file(cls, ca: str | Path, flag: str = "--tls-ca") -> ClientTls:
        return cls(_read_pem(ca, flag, "CERTIFICATE"))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates)


def add_port(server: grpc.aio.Server | grpc.Server, address: str, tls: ServerTls | None) -> int:
    """Bind `address` (host:port, port 0 picks one), TLS when `tls` is given; returns the port.
    Raises OSError when the address cannot be bound."""
    try:
        port = (
            server.add_secure_port(address, tls.credentials())
            if tls is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError as err:  # grpc raises RuntimeError for a port in use
        raise OSError(f"cannot bind {address}: {err}") from None
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return port


def aio_channel(target: str, tls: ClientTls | None = None, options: ChannelOptions = ()) -> grpc.aio.Channel:
    """An asyncio channel to `target`: TLS verified against `tls`, or plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, tls.credentials(), options=list(options))


def sync_channel(target: str, tls: ClientTls | None = None, options: ChannelOptions = ()) -> grpc.Channel:
    """A blocking channel to `target`: TLS verified against `tls`, or plaintext."""
    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, tls.credentials(), options=list(options))


# --- command-line flags -----------------------------------------------------------------------


def server_tls_from_args(args: argparse.Namespace) -> ServerTls | None:
    """`--tls-cert` / `--tls-key` (each CLI declares them; this module imports grpc, which a
    parser must not) as a ServerTls, None without them."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise AsyncdapoError("--tls-cert and --tls-key go together: give both or neither")
    return ServerTls.from_files(args.tls_cert, args.tls_key) if args.tls_cert else None


def client_tls_from_args(args: argparse.Namespace, flag: str = "--tls-ca") -> ClientTls | None:
    """A client's CA flag (`--tls-ca` by default) as a ClientTls, None without it."""
    path = getattr(args, flag.lstrip("-").replace("-", "_"))
    return ClientTls.from_file(path, flag) if path else None


# --- watch intervals ---------------------------------------------------------------------------


def watch_interval_s(interval_ms: int, default_ms: int) -> float:
    """The period of a watch stream: `default_ms` for 0, else `interval_ms` if within bounds.
    Raises ValueError naming the field and the bounds."""
    if interval_ms == 0:
        return default_ms / 1000
    if not MIN_WATCH_INTERVAL_MS <= interval_ms <= MAX_WATCH_INTERVAL_MS:
        raise ValueError(
            f"interval_ms must be 0 (default, {default_ms} ms) or between {MIN_WATCH_INTERVAL_MS} "
            f"and {MAX_WATCH_INTERVAL_MS}, got {interval_ms}"
        )
    return interval_ms / 1000
