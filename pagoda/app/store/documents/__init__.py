"""Attached documents and a chat's folders in the database, with their passages."""
