"""Rule verifiers: deterministic callables from a response and a gold answer to a RewardResult."""
