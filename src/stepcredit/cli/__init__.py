"""stepcredit.cli."""
