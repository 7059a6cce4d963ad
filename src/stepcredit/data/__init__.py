"""stepcredit.data."""
