"""`python -m pagoda`: the desktop app (the `pagoda` command)."""

import multiprocessing
import sys

from pagoda.app.main import main

if __name__ == "__main__":
    # In the bundle, the process documents are read in (documents/reading_process.py) starts as
    # this program with multiprocessing's arguments: they are answered here, before main's.
    multiprocessing.freeze_support()
    sys.exit(main())
