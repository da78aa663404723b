"""Bookkeeping without tensors: sequences, the scheduler, KV blocks and their prefix hashes."""
