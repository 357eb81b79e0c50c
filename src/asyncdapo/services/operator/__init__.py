"""asyncdapo.services.operator — see README.md in services/operator."""
