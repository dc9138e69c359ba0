"""The routing interface: which engine instance gets a new request.

Like policies, routers are pure logic shared by the simulator and the gateway. The driver calls
`route(seq, instances, now, allowed)` once per arrival with a view of each instance and sends the
request to the returned index; `on_finish` tells the router a request completed there,
`on_cancel` that it left there unfinished (the gateway: cancelled, failed, or moved to another
backend). A router keeps its per-instance state (work, prefixes sent) by position in
`instances`, so a driver passes the same list every time; `allowed` restricts the choice to some
positions (the gateway: the healthy backends serving the request's model that have not failed
it), so the router records the request where it is actually sent.

An instance view has: `index`, `num_waiting`, `num_running`, `num_outstanding`,
`kv_free_fraction`, and `outstanding()` (iterator over its unfinished requests' seqs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol, Sequence

from presched.registry import Registry
from presched.schedule.interface import SeqView
from presched.schedule.params import NoParams, PolicyParams, parse


class InstanceView(Protocol):
    index: int
    num_waiting: int
    num_running: int
    num_outstanding: int
    kv_free_fraction: float

    def outstanding(self) -> Any: ...


class Router(ABC):
    """Base class of routers. Options, as for policies, are a frozen pydantic model `Params`
    (`schedule/params.py`), validated by `__init__` into `self.params`."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type[PolicyParams]] = NoParams
    oracle: ClassVar[bool] = False
    needs_progress: ClassVar[bool] = True
    """False if `route` reads only counts (`num_waiting`, `num_running`, `num_outstanding`),
    not per-request progress (`generated`) or KV use. The simulator can then leave a decode run
    pending across arrivals routed elsewhere (faster, same result)."""
    reads_prefix: ClassVar[bool] = False
    """True if `route` reads the request's prefix-cache block hashes (`seq.request.block_hashes`);
    the gateway then hashes every prompt it receives (serve/tokens.py)."""

    def __init__(self, **params: Any) -> None:
        self.params: PolicyParams = parse(type(self).Params, params)

    @abstractmethod
    def route(self, seq: SeqView, instances: Sequence[InstanceView], now: float,
              allowed: Sequence[int] | None = None) -> int:  # fmt: skip
        """Index (into `instances`) of the instance that gets `seq`, one of `allowed` (positions
        in ascending order, at least one; None: every instance). Ties: lowest index."""

    def on_finish(self, seq: SeqView, instance: int, now: float) -> None:
        """A request routed to `instance` finished."""

    def on_cancel(self, seq: SeqView, instance: int, now: float) -> None:
        """A request routed to `instance` left it unfinished (its client went away, it failed
        there, or the gateway moved it to another instance, which routes it again): drop what
        is kept for it. Its `generated` is no true length (do not learn from it). Default:
        ignore (routers without per-request state)."""


def positions(instances: Sequence[InstanceView], allowed: Sequence[int] | None) -> Sequence[int]:
    """The positions a router may choose from: `allowed`, or every instance."""
    return range(len(instances)) if allowed is None else allowed


ROUTERS: Registry[Router] = Registry("router")
