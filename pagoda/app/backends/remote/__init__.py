"""A chat with any OpenAI-compatible server over HTTP: OpenAIBackend, its requests and streams, what a server says of itself, the endpoint, server-sent events, HTTP errors in words."""
