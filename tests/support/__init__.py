"""What several test directories share: a real local cluster (cluster.py)."""
