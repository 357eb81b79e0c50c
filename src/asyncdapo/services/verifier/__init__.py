"""asyncdapo.services.verifier — see README.md in services/verifier."""
