"""Pagoda's desktop application (PySide6): windows, tabs and their controllers; the store."""

__version__ = "0.1.0"
