"""asyncdapo: asynchronous DAPO on Kubernetes. Layers, each importing only those below it:
contracts <- runtime <- services <- tools (see docs/architecture.md; `make lint` enforces it)."""
