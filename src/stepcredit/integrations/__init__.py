"""stepcredit.integrations."""
