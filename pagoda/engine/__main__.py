"""`python -m pagoda.engine`: the engine's command line (see pagoda/engine/cli/main.py)."""

import sys

from pagoda.engine.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
