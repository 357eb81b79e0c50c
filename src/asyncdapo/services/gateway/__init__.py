"""asyncdapo.services.gateway — see README.md in services/rollout-gateway."""
