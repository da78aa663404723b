"""The chat's settings panel and the appearance settings."""
