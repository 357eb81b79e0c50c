"""The simulator's error, in a plain module: compiled classes (asyncdapo.simulate.native) cannot
derive from two built-in exception types."""

from asyncdapo.errors import AsyncdapoError


class SimulationError(AsyncdapoError, RuntimeError):
    """A configuration the simulator cannot run, or a run that stopped before its last version."""
