"""Scorers that manage their own I/O: LLM judges (HTTP) and reward models (a model process)."""
