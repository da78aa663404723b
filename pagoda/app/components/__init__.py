"""The window's state without a window: chats, sessions, model lists, connections, the local
server's settings. Plain models that run (and are tested) with no Qt; pagoda.app.qt renders them."""
