"""asyncdapo.verifier — see README.md in services/verifier."""
