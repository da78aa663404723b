"""The Llama family of models (Llama, SmolLM2, Qwen2/3, Mistral), what their configs imply, and
the memory their weights and KV cache take."""
