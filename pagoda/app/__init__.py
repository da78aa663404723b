"""Pagoda's desktop application (PySide6): windows, tabs and their controllers; the store."""
