"""Quantized weights: canonical layouts (`tensors`) and how each layer stores and applies them."""
