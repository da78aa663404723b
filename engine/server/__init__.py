"""An OpenAI-compatible HTTP server over the engine: `python -m engine serve`, or the app's own."""
