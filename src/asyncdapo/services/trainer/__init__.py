"""asyncdapo.services.trainer — see README.md in services/trainer."""
