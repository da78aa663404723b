"""`python -m engine`: the engine's command line (see engine/cli/main.py)."""

import sys

from engine.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
