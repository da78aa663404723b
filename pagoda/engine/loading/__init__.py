"""A model source (GGUF file, Hugging Face folder or repo) into weights, a tokenizer and facts."""
