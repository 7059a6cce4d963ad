"""stepcredit.reward."""
