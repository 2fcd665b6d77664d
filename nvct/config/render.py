"""config.toml as the reference writes it: sorted keys, keys before sub-tables, examples commented.

``nvct config`` and ``nvct toolkit install`` both write config.toml through
:func:`render`, so a file either wrote reads the same.
"""

from __future__ import annotations

import re
from typing import Any

from nvct.config import keys

#: Feature flags the reference knows (``[features]``, each a boolean).
FEATURES = keys.feature_flags()

#: Settings written commented out, with an example value, unless set (the reference's list).
EXAMPLES = keys.examples()


def render(data: dict, explicit: set | None) -> str:
    """TOML in the reference's layout: sorted keys, keys before sub-tables.

    With ``explicit`` (the keys the user set), settings in :data:`EXAMPLES` that
    are unset, empty or equal to the example are written as ``#key = example``.
    ``explicit=None`` writes every value as it is.
    """
    lines: list = []
    _render_table(data, (), explicit, lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _render_table(table: dict, prefix: tuple, explicit: set | None, lines: list) -> None:
    scalars = [k for k, v in table.items() if not isinstance(v, dict)]
    tables = sorted(k for k, v in table.items() if isinstance(v, dict))
    body = []
    for name in sorted(set(scalars) | set(_commented_keys(prefix, explicit))):
        dotted = ".".join(prefix + (name,))
        value = table.get(name)
        if explicit is not None and dotted in EXAMPLES and dotted not in explicit and \
                _should_comment(dotted, value):
            body.append(f"#{_key(name)} = {_value(EXAMPLES[dotted])}")
        else:
            body.append(f"{_key(name)} = {_value(value)}")
    if prefix and (body or tables):  # an empty table (no features set) is left out
        lines += ["", "[" + ".".join(_key(p) for p in prefix) + "]"]
    lines += body
    for name in tables:
        _render_table(table[name], prefix + (name,), explicit, lines)


def _commented_keys(prefix: tuple, explicit: set | None) -> list:
    if explicit is None:
        return []
    dotted = ".".join(prefix)
    return [k[len(dotted) + 1:] if dotted else k for k in EXAMPLES
            if (k.rsplit(".", 1)[0] if "." in k else "") == dotted]


def _should_comment(key: str, value: Any) -> bool:
    if key == keys.Settings.runtime_debug.name and value == "/dev/null":
        return True
    return value is None or value == "" or value == EXAMPLES[key]


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else '"' + name.replace('"', '\\"') + '"'


def _value(value: Any) -> str:
    import tomlkit

    return tomlkit.item(value).as_string()
