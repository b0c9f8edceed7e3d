"""The chart's tests ask NetworkPolicy semantics from their one home, slonk.kube.netpol."""

from slonk.kube.netpol import Endpoint, allowed, selects

__all__ = ["Endpoint", "allowed", "selects"]
