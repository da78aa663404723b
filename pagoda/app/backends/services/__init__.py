"""What the window asks of the engine besides chats: making it, model files, the Hub, the local OpenAI server, embeddings, the engine imported off the GUI thread."""
