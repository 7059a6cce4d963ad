"""Execution: the one dispatcher (Rewarder), the kill-safe pool and the asynchronous agent."""
