"""stepcredit.rollout."""
