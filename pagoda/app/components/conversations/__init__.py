"""The chats as a list: the open tabs, importing chats, the names exports suggest."""
