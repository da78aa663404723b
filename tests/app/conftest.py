"""Qt tests run offscreen; set before pytest-qt creates the QApplication."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
