"""gpuwatch: observability agent for GPU hosts that serve large language models."""

__version__ = "0.1.0"
