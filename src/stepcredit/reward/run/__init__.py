"""Execution of rewards: routing (``routing``), the one execution path (the reward ``agent`` over its
``backends``, with ``rewarder`` as its synchronous face), the kill-safe ``pool`` and ``health`` checks."""
