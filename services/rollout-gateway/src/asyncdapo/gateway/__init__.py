"""asyncdapo.gateway — see README.md in services/rollout-gateway."""
