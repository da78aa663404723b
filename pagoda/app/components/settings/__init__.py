"""The settings a new chat starts with."""
