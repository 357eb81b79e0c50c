"""Services: one package per deployable process (scheduler, gateway, trainer, verifier, operator).
Each imports contracts and runtime, never another service or a tool."""
