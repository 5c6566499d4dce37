"""One shape for every name-to-thing table of bayesurl.

Methods, post-hoc wrappers, estimators, data sets and metrics are each a :class:`Registry`:
an entry is added with a decorator (or a call) that records the name, the class or function,
and the traits it declares about itself, so that no other module keeps a list of names or a
branch per name. A reader asks the registry (``names(kind="pool")``, ``traits(name)``),
never a literal tuple.

    >>> from bayesurl.registry import Registry
    >>> shapes = Registry("shape")
    >>> @shapes.register("square", corners=4)
    ... class Square: ...
    >>> shapes.get("Square") is Square, shapes.traits("square")["corners"]
    (True, 4)
    >>> shapes.names(corners=4)
    ('square',)

Modelled on timm's single model registry and laplace-torch's factory over a small class
lattice: the registry answers questions about an entry (its traits) without building it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

__all__ = ["Entry", "Registry"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Entry(Generic[_T]):
    """One registered thing: its ``name``, the ``obj`` (a class or function) and its ``traits``."""

    name: str
    obj: _T
    traits: Mapping[str, Any] = field(default_factory=dict)


class Registry(Generic[_T]):
    """Names to classes or functions, each with the traits it declared when registered.

    Parameters
    ----------
    what : str
        What an entry is (``"method"``, ``"estimator kind"``): used in error messages.
    normalise : callable, optional
        Maps a name as typed to its key (default: lower case, ``-`` read as ``_``).
    load : callable, optional
        Called once before the first lookup, to import the modules whose decorators fill the
        registry (a plugin folder read lazily, so that importing the registry stays cheap).
    """

    def __init__(
        self,
        what: str,
        *,
        normalise: Callable[[str], str] | None = None,
        load: Callable[[], None] | None = None,
    ) -> None:
        self.what = what
        self._normalise = normalise or (lambda s: str(s).lower().replace("-", "_"))
        self._load = load
        self._loaded = load is None
        self._entries: dict[str, Entry[_T]] = {}

    # -- adding -----------------------------------------------------------------------------
    def register(self, name: str, *, replace: bool = False, **traits: Any) -> Callable[[_T], _T]:
        """Decorator adding the decorated class or function under ``name`` with ``traits``.

        Raises
        ------
        ValueError
            If ``name`` is taken by another object and ``replace`` is false.
        """

        def deco(obj: _T) -> _T:
            self.add(name, obj, replace=replace, **traits)
            return obj

        return deco

    def add(self, name: str, obj: _T, *, replace: bool = False, **traits: Any) -> Entry[_T]:
        """Add ``obj`` under ``name`` (the call form of :meth:`register`)."""
        key = self._normalise(name)
        if not key:
            raise ValueError(f"a {self.what} needs a non-empty name")
        old = self._entries.get(key)
        if old is not None and old.obj is not obj and not replace:
            raise ValueError(f"{self.what} name {name!r} is registered twice")
        entry = Entry(key, obj, MappingProxyType(dict(traits)))
        self._entries[key] = entry
        return entry

    def remove(self, name: str) -> Entry[_T]:
        """Remove and return the entry ``name`` (ValueError naming the valid ones if unknown)."""
        return self._entries.pop(self.entry(name).name)

    # -- reading ----------------------------------------------------------------------------
    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            assert self._load is not None
            self._load()

    def entry(self, name: str, *, argument: str | None = None) -> Entry[_T]:
        """The entry ``name`` (normalised).

        Parameters
        ----------
        name : str
            The name as the user typed it.
        argument : str, optional
            The argument or flag the name came from, named in the error (``"--method"``).

        Raises
        ------
        ValueError
            For an unknown name, naming ``argument`` and listing the valid names.
        """
        self._ensure_loaded()
        key = self._normalise(getattr(name, "value", name))
        if key not in self._entries:
            where = f"`{argument}` " if argument else f"{self.what} "
            raise ValueError(
                f"unknown {where}{name!r}; valid names: {', '.join(self.names()) or '(none)'}"
            )
        return self._entries[key]

    def get(self, name: str, *, argument: str | None = None) -> _T:
        """The class or function registered under ``name`` (see :meth:`entry`)."""
        return self.entry(name, argument=argument).obj

    def traits(self, name: str) -> Mapping[str, Any]:
        """The traits ``name`` declared (read-only)."""
        return self.entry(name).traits

    def names(self, **where: Any) -> tuple[str, ...]:
        """Registered names in registration order, keeping those whose traits match ``where``.

        A trait value given as a tuple, list or set matches any of its members.
        """
        self._ensure_loaded()

        def keep(entry: Entry[_T]) -> bool:
            for k, want in where.items():
                have = entry.traits.get(k)
                if isinstance(want, (tuple, list, set, frozenset)):
                    if have not in want:
                        return False
                elif have != want:
                    return False
            return True

        return tuple(e.name for e in self._entries.values() if keep(e))

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return isinstance(name, str) and self._normalise(name) in self._entries

    def __iter__(self) -> Iterator[Entry[_T]]:
        self._ensure_loaded()
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {len(self._entries)} entries)"
