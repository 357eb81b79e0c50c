"""asyncdapo.scheduler — see README.md in services/scheduler."""
