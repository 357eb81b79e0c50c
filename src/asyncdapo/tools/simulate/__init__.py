"""SIMULATOR: `asyncdapo simulate` — the scheduler's rollout core at cluster scale on a virtual clock.

Importing the package loads the mypyc-compiled build of its hot modules when one exists for the
current sources (`asyncdapo.tools.simulate.native`); otherwise the plain modules run, with the same
results."""

from asyncdapo.tools.simulate.native import activate

activate()
