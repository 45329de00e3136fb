"""infertrace: why LLM inference latency went wrong."""

__version__ = "0.1.0"
