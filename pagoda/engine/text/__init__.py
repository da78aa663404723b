"""Text at the engine's edges: chat templates (sandboxed), tokenizing chats, detokenizing, Unicode."""
