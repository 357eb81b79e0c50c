"""Runtime: machinery every service shares — the Redis connection and its outage waiter, retry
backoff, gRPC security, secret files, metrics, model locations, the verifier client and the weight
stream. Imports contracts only."""
