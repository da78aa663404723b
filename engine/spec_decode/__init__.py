"""Speculative decoding by n-gram prompt lookup: propose drafts, verify them in the normal step."""
