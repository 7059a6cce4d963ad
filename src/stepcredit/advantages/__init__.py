"""stepcredit.advantages."""
