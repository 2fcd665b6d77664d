"""Small immutable value classes, built without dataclasses.

The shim and the hook run on every container start, and importing
dataclasses and building a dozen classes with it costs ~17 ms there. A
subclass lists its fields in ``__slots__`` (in order) and their defaults in
``_defaults``; fields named in ``_uncompared`` (by default ``reason``) take no
part in equality or hashing. The compared fields' tuple is built once: merging
edits puts every record in a set, once per device merged.
"""

from __future__ import annotations


class Record:
    __slots__: tuple[str, ...] = ("_cached_key",)
    _cached_key: tuple  # the compared fields, built on first use
    _defaults: dict = {}
    _uncompared: frozenset = frozenset({"reason"})

    def __init__(self, *args, **kwargs):
        fields = self.__slots__
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes at most {len(fields)} arguments")
        values = dict(zip(fields, args))
        for key, value in kwargs.items():
            if key not in fields or key in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated argument {key!r}")
            values[key] = value
        for name in fields:
            if name in values:
                value = values[name]
            elif name in self._defaults:
                value = self._defaults[name]
            else:
                raise TypeError(f"{type(self).__name__}: missing argument {name!r}")
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; use replace()")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _key(self) -> tuple:
        try:
            return self._cached_key
        except AttributeError:
            key = tuple(getattr(self, f) for f in self.__slots__ if f not in self._uncompared)
            object.__setattr__(self, "_cached_key", key)
            return key

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return other is self or self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__)
        return f"{type(self).__name__}({args})"

    def replace(self, **changes):
        """A copy with ``changes`` applied."""
        values = {f: getattr(self, f) for f in self.__slots__}
        values.update(changes)
        return type(self)(**values)

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}
