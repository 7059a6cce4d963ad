"""stepcredit.process."""
