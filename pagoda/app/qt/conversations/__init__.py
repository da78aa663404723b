"""The chat list (sidebar) and the database dialog at start."""
