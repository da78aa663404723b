"""Every command line of `pagoda-engine` / `python -m pagoda.engine`: generate, chat, serve, pull."""
