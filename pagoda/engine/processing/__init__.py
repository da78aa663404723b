"""A step's sampled tokens into what the engine hands back (vLLM's output processing): text
detokenized as it grows, stop strings matched, logprobs named by their tokens."""
