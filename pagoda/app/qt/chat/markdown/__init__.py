"""A reply's Markdown as the transcript renders it: code, quotes, math."""
