"""One open chat's widgets and its controller: the tab, the transcript, the composer, the context meter."""
