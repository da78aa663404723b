"""Export and import: the JSON and Markdown formats, and checking an export before it is imported."""
