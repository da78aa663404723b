"""What owns tensors: the model runner, the KV pool, sampling, CUDA graphs, process memory."""
