"""Model building blocks whose storage depends on the weights' format (vLLM's layers)."""
