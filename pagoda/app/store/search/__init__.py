"""Search: what the user typed as an FTS5 query, Chinese and Japanese two-character words, passages' vectors."""
