"""When the engine is imported: after the window shows, on the app's own worker threads (the
host's, the model reader's, the local server's), one thread at a time.

Importing torch, transformers and fastapi takes seconds, which the GUI thread must not wait
for. Threads that import the same modules at once can deadlock on Python's per-module import
locks, so they take turns: import the engine's heavy modules only while holding
ENGINE_IMPORT_LOCK. Once a module is imported, importing it again costs nothing, on any thread.
"""

import threading

ENGINE_IMPORT_LOCK = threading.Lock()
