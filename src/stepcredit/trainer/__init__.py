"""stepcredit.trainer."""
