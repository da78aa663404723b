"""A chat's documents and folders as chips, the passage a reply cites, the Documents dialog."""
