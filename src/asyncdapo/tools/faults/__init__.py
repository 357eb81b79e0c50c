"""Process-level fault harness for durability tests and the chaos soak.

- `procs.FaultStack`: Redis (AOF, fsync always), the verifier, SIMULATOR gateways in answer-key
  mode, the scheduler and the trainer as real subprocesses that can be SIGKILLed, SIGTERMed,
  SIGSTOPped and restarted on the same port (children of `tools.local.supervisor`: one process
  group each);
- `proxy.FaultProxy` / `proxy.ProxyThread`: a TCP proxy (RESP-aware for Redis, raw for gRPC) that
  cuts connections, refuses them for a while, or loses the reply to a chosen command;
- `invariants.InvariantChecker`: reads Redis and the trainer's ledger and reports violations of
  the durability invariants (one outcome per attempt, no stranded claim, each group trained once…)
  from one atomic `snapshot` of the run's Redis state;
- `assets.build_fault_assets`: the tiny model, data, run config and answer key a stack runs on.
"""
