"""The PySide6 desktop application (issue 4)."""
