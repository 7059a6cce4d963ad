"""stepcredit.losses."""
