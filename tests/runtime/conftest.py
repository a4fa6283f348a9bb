"""Multi-process fixtures (pool4, pool8, pool) live in tests/conftest.py, shared by every test
folder so one gloo pool per world size serves the whole session."""
