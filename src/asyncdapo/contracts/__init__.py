"""Contracts: what crosses a process boundary — the run configuration, the Redis data model, the
dataset format, the verifier's HTTP schemas, the gRPC stubs and wire enums. Imports nothing else of
asyncdapo."""
