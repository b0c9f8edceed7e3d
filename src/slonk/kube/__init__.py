"""Kubernetes and Helm: the API client the controller's loops use (api), the chart rendered
through Helm's Go library (chart), and NetworkPolicy semantics (netpol)."""
