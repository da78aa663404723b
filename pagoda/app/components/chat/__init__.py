"""One open chat without a window: its session (send, stop, regenerate, branches), the prompt built from its branch, its tool turns, where its replies come from."""
