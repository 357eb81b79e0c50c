"""asyncdapo's version: one number for the wheel, the images, the CLI and the verifier's /version."""

__version__ = "0.1.0"
