"""A tiny name -> factory registry, one per family (policies, routers, step models, loaders).

    POLICIES = Registry[Policy]("policy")

    @POLICIES.register("fcfs")
    class FCFS(Policy): ...

    POLICIES.create("fcfs", **kwargs)
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name that is not in a registry; the message lists the known names."""


class Registry(Generic[T]):
    def __init__(self, family: str) -> None:
        self.family = family
        self._items: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._items:
                raise ValueError(f"{self.family} {name!r} is registered twice")
            self._items[name] = factory
            return factory

        return deco

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise UnknownNameError(f"unknown {self.family} {name!r}; known: {known}") from None

    def create(self, name: str, *args, **kwargs) -> T:
        return self.get(name)(*args, **kwargs)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
