"""Choose implementations by name: attention backends, prefix caches, models, MoE backends."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> creator table. Creators import their heavy dependencies lazily, inside
    themselves."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._creators: dict[str, Callable[..., T]] = {}

    def register(self, *names: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def wrap(creator: Callable[..., T]) -> Callable[..., T]:
            for name in names:
                assert name not in self._creators, f"{self.kind} {name!r} registered twice"
                self._creators[name] = creator
            return creator

        return wrap

    def get(self, name: str) -> Callable[..., T]:
        if name not in self._creators:
            raise ValueError(f"unknown {self.kind} {name!r}; "
                             f"choose one of: {', '.join(self.names)}")
        return self._creators[name]

    def __contains__(self, name: str) -> bool:
        return name in self._creators

    @property
    def names(self) -> list[str]:
        return sorted(self._creators)
