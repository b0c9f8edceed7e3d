"""The chart's tests ask NetworkPolicy semantics from their one home, slonk.netpol."""

from slonk.netpol import Endpoint, allowed, selects

__all__ = ["Endpoint", "allowed", "selects"]
