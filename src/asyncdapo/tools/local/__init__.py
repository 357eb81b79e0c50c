"""The local stack: services as supervised subprocesses on 127.0.0.1."""
