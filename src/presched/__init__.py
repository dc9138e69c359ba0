"""presched: predict LLM output lengths and schedule requests with that knowledge."""

__version__ = "0.1.0"
