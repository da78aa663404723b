"""Pagoda: a desktop chat application (pagoda.app) with its own inference engine (pagoda.engine)
and kernels (pagoda.kernels). Dependencies point one way, app -> engine -> kernels (pyproject's
import-linter contracts)."""

__version__ = "0.1.0"
