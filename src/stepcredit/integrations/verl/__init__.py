"""stepcredit.integrations.verl."""
