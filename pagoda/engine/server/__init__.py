"""An OpenAI-compatible HTTP server over the engine: `python -m pagoda.engine serve`, or the app's own."""
