"""asyncdapo's version (the `asyncdapo` package is a namespace shared by every service's source
root — services/<service>/src/asyncdapo/ — so it has no __init__.py to hold it)."""

__version__ = "0.1.0"
