"""A file read into a Document: its type sniffed, PDF by PDFium, Office and HTML by markitdown, in a worker process within limits on memory and time."""
