"""Tensor routing: how staging copies each tensor of a state_dict, recorded while it is flattened."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

#: How staging copies a tensor (``Sources.routes``); a CUDA device index (>= 0) means a contiguous
#: tensor on that GPU, copied from its address.
ROUTE_HOST = -1  # contiguous CPU tensor: the engine copies it from its address
ROUTE_TORCH = -2  # anything else (non-contiguous views, conjugate or negative bits, other devices): Tensor.copy_


class Sources(list):
    """The state_dict's tensors in entry order, with each one's data address and staging route.

    Recorded while flattening (which visits every tensor anyway), so staging can copy thousands of
    tensors without touching each one from Python again.
    """

    def __init__(self, tensors: Iterable[Any] = ()) -> None:
        super().__init__()
        self.addresses = array("q")
        self.routes = array("h")
        for t in tensors:  # (tensors copied by value may have no storage to point at: no data_ptr())
            route = route_of(t, t.get_device())
            self.add(t, t.data_ptr() if route != ROUTE_TORCH else 0, route)

    def add(self, tensor: Any, address: int, route: int) -> None:
        self.append(tensor)
        self.addresses.append(address)
        self.routes.append(route)

    @classmethod
    def of(cls, tensors: list[Any]) -> Sources:
        return tensors if isinstance(tensors, Sources) else cls(tensors)

    @classmethod
    def of_columns(cls, tensors: list[Any], addresses: array, routes: array) -> Sources:
        """``tensors`` with their addresses and routes as recorded before (:class:`PlanCache`), the
        arrays shared, not copied."""
        sources = cls()
        sources.extend(tensors)
        sources.addresses, sources.routes = addresses, routes
        return sources


def route_of(t: Any, device: int) -> int:
    """``t``'s staging route; ``device`` is ``t.get_device()``."""
    return route_for(t, device, t.is_conj() or t.is_neg())


def route_for(t: Any, device: int, lazy_bits: bool) -> int:
    """:func:`route_of` with ``t``'s conjugate or negative bit read already (``lazy_bits``: either set)."""
    if lazy_bits or not t.is_contiguous():
        return ROUTE_TORCH
    if t.is_cuda:
        return device
    return ROUTE_HOST if t.is_cpu else ROUTE_TORCH
