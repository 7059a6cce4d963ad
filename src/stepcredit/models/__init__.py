"""stepcredit.models."""
