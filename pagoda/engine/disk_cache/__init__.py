"""The prefix cache's disk tier: block files on disk, their writer, and the KV copy in and out."""
