"""SIMULATOR: `asyncdapo simulate` — the scheduler's rollout core at cluster scale on a virtual clock."""
