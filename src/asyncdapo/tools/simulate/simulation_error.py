"""The simulator's error, in a plain module: compiled classes (asyncdapo.tools.simulate.native) cannot
derive from two built-in exception types."""

from asyncdapo.contracts.errors import AsyncdapoError


class SimulationError(AsyncdapoError, RuntimeError):
    """A configuration the simulator cannot run, or a run that stopped before its last version."""
