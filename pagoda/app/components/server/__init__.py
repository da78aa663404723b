"""The window's engine served over OpenAI's API on 127.0.0.1, and its key."""
