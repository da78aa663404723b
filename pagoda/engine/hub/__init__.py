"""The Hugging Face Hub: finding GGUF models, downloading them, and whether they fit this machine."""
