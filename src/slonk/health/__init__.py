"""Node health checks: run them, drain and undrain nodes, recycle the pods of bad ones."""
