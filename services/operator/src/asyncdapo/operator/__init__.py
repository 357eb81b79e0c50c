"""asyncdapo.operator — see README.md in services/operator."""
