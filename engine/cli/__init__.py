"""Every command line of `pagoda-engine` / `python -m engine`: generate, chat, serve, pull."""
