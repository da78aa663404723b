"""What owns tensors: the model runner, the KV pool, sampling and verifying drafts, CUDA graphs,
what a step costs here (calibration), this process's resident memory."""
