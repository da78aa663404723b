"""Qt widgets: they render view models and emit signals; they never call the engine or the store."""
