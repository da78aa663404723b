"""The local server's settings and controller, its key dialog, adding a remote server."""
