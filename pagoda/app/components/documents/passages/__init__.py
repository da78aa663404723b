"""A Document cut into passages, a question as a search, the prompt's documents."""
