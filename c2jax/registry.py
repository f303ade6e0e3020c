"""Named registries for pluggable pieces (advantage estimators, policy losses, KL estimators, reward terms, ...).

An ablation is then a config override (`--config.rl.advantage=grpo`), not a code edit:

  ADVANTAGES = Registry("advantage estimator")

  @ADVANTAGES.register("dr_grpo")
  def dr_grpo(...): ...

  fn = ADVANTAGES.get(cfg.advantage)      # unknown names fail with one sentence listing the known ones
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """A name -> object table with registration by decorator and errors that list the choices."""

  def __init__(self, kind: str):
    self.kind = kind
    self._items: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator that registers its target under `name` (names are unique)."""

    def add(item: T) -> T:
      if name in self._items:
        raise ValueError(f"A {self.kind} named {name!r} is already registered.")
      self._items[name] = item
      return item

    return add

  def get(self, name: str) -> T:
    try:
      return self._items[name]
    except KeyError:
      raise ValueError(f"Unknown {self.kind} {name!r}; known: {', '.join(sorted(self._items))}.") from None

  def names(self) -> list[str]:
    return sorted(self._items)

  def __contains__(self, name: str) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())
