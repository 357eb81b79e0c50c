"""asyncdapo.trainer — see README.md in services/trainer."""
