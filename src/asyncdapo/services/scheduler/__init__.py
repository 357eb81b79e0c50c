"""asyncdapo.services.scheduler — see README.md in services/scheduler."""
