"""Process-wide tracer state, importable without torch (spans use it on every call)."""

recorder = None  # the rank's Recorder once its default process group exists
