"""Node health checks: run them, drain and undrain nodes (the pods of drained nodes are
recycled by the controller's recycle loop, slonk.align.recycle)."""
