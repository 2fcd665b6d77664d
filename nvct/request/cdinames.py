"""CDI names: a kind is ``vendor/class``, a device is ``vendor/class=name``.

The character rules are the CDI library's (ASCII only): vendor and class
start with a letter and end with a letter or digit, with ``-``, ``_`` and
``.`` between; a device name starts and ends with a letter or digit, with
``-``, ``_``, ``.`` and ``:`` between. Which of these a given ``cdiVersion``
permits (a leading digit, a dot in the class) is :mod:`nvct.cdi.schema`'s
business. Checks return the reason a name is invalid, or ``None``.
"""

from __future__ import annotations

_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ALNUM = _LETTERS | frozenset("0123456789")
_KIND_INNER = _ALNUM | frozenset("-_.")
_NAME_INNER = _ALNUM | frozenset("-_.:")


def vendor_error(vendor: str) -> str | None:
    return _kind_part_error("vendor", vendor)


def class_error(cls: str) -> str | None:
    return _kind_part_error("class", cls)


def device_name_error(name: str) -> str | None:
    if not name:
        return "empty device name"
    if name[0] not in _ALNUM:
        return f"device name {name!r} must start with a letter or digit"
    if name[-1] not in _ALNUM:
        return f"device name {name!r} must end with a letter or digit"
    for c in name[1:-1]:
        if c not in _NAME_INNER:
            return f"invalid character {c!r} in device name {name!r}"
    return None


def _kind_part_error(what: str, value: str) -> str | None:
    if not value:
        return f"empty {what}"
    if value[0] not in _LETTERS:
        return f"{what} {value!r} must start with a letter"
    if value[-1] not in _ALNUM:
        return f"{what} {value!r} must end with a letter or digit"
    for c in value[1:-1]:
        if c not in _KIND_INNER:
            return f"invalid character {c!r} in {what} {value!r}"
    return None


def split_kind(kind: str) -> tuple[str, str]:
    """``vendor/class`` -> (vendor, class); ("", kind) when there is no such split."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        return "", kind
    return vendor, cls


def kind_error(kind: str) -> str | None:
    vendor, cls = split_kind(kind)
    if not vendor:
        return f"kind {kind!r} is not of the form vendor/class"
    return vendor_error(vendor) or class_error(cls)


def parse_qualified(name: str) -> tuple[str, str, str]:
    """``vendor/class=device`` -> (vendor, class, device); ValueError saying why not."""
    kind, sep, device = name.partition("=")
    vendor, cls = split_kind(kind) if sep else ("", "")
    if not vendor or not device or name.startswith("/"):
        raise ValueError(f"{name!r} is not a fully-qualified CDI device name (vendor/class=name)")
    reason = vendor_error(vendor) or class_error(cls) or device_name_error(device)
    if reason:
        raise ValueError(f"invalid CDI device name {name!r}: {reason}")
    return vendor, cls, device


def is_qualified(name: str) -> bool:
    try:
        parse_qualified(name)
    except ValueError:
        return False
    return True


def qualify(name: str, default_kind: str) -> str:
    """A fully-qualified name as is; anything else as a device of ``default_kind``."""
    return name if is_qualified(name) else f"{default_kind}={name}"
