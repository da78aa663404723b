"""Speculative decoding by n-gram prompt lookup: drafts proposed, and how many a step verifies
(the worker verifies them in the normal step: pagoda/engine/worker/rejection_sampler.py)."""
