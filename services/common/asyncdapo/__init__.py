"""asyncdapo: Kubernetes-native asynchronous DAPO for LLMs on verifiable math."""

__version__ = "0.1.0"
