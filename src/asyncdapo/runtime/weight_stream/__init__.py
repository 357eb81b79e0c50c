"""Weights without a shared volume: a policy version's model directory in checksummed chunks.

`manifest` (what a version is made of: files, chunks, digests), `store` (the versions a process
holds or is receiving, thread-safe), `service` (the `asyncdapo.v1.WeightStore` gRPC servicer over a
store), `fetch` (pulling a version from a list of sources into a store: resumable, checked, falls
back to the next source when one fails or stalls), `store_server` (a WeightStore server on a
thread of its own, for the synchronous trainer), `uri` (the `stream://HOST:PORT` form).
"""
