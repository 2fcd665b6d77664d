"""``NVIDIA_REQUIRE_*``: what an image demands of the host's driver and GPUs.

The language is libnvidia-container's: in one expression a space separates
alternatives (any may hold) and a comma joins conditions (all must hold).
A condition is ``PROPERTY OP VALUE`` with property ``cuda`` (the driver's
CUDA version), ``driver`` (the kernel module version), ``arch`` (a device's
compute capability) or ``brand`` (a device's brand, compared
case-insensitively with ``=``/``!=`` only). Versions compare numerically,
component by component, missing components counting as zero.

As in libnvidia-container, each expression is evaluated once per visible
device (``arch``/``brand`` refer to that device) and must hold for every one;
with no visible device it is evaluated once and ``arch``/``brand`` hold. An
unknown fact (no CUDA version, no brand) makes its conditions hold.

Unlike libnvidia-container, which only notices a malformed condition when it
evaluates it, every condition is checked up front: a typo is an error, not a
pass that depends on which alternative happened to be tried first. An unknown
property (``foo=bar``) is the exception: as in the reference, that condition
is skipped with a warning and the known ones are still checked, so images
written for a newer toolkit keep running.
"""

from __future__ import annotations

from nvct.base.errors import RequirementError
from nvct.base.record import Record

TYPE_CHECKING = False  # no re, dataclasses or typing: every GPU container start imports this
if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence, Tuple

    from nvct.discover.driver import Driver, Gpu

    Device = Tuple[Optional[str], Optional[str]]  # (arch "9.0", brand "tesla")
    Verdict = Tuple[str, bool]  # (condition text, holds)

__all__ = [
    "Condition",
    "Requirement",
    "DriverFacts",
    "driver_facts",
    "parse",
    "collect",
    "check",
    "explain",
    "MAX_LENGTH",
]

MAX_LENGTH = 4096  # far above any real image's value; bounds hostile ones

_PREFIX = "NVIDIA_REQUIRE_"
_JETPACK_PREFIX = "NVIDIA_REQUIRE_JETPACK"  # a CSV-mode flag, not a condition
_DISABLE = "NVIDIA_DISABLE_REQUIRE"
_LEGACY_VERSION = "CUDA_VERSION"

_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
_OPERATOR_CHARS = "<>=!"
_VERSION_PROPERTIES = ("cuda", "driver", "arch")
_PROPERTIES = _VERSION_PROPERTIES + ("brand",)
_DIGITS = frozenset("0123456789")
_VERSION_CHARS = _DIGITS | {"."}
_IDENTIFIER_CHARS = _DIGITS | frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")
_MAX_COMPONENT = 2**64 - 2  # strtoumax's overflow value is rejected too
_UPDATE_HINT = ", please update your driver to a newer version, or use an earlier cuda container"
# NVIDIA_DISABLE_REQUIRE true spellings, compared lower-cased: Go's
# strconv.ParseBool's plus "yes"/"on" (a deliberate difference, docs/differences.md).
_TRUE = frozenset({"1", "t", "true", "yes", "on"})


class DriverFacts(Record):
    """What the host offers; ``None`` means unknown (its conditions hold)."""

    __slots__ = ("cuda", "driver", "devices")
    _defaults = {"cuda": None, "driver": None, "devices": ()}
    cuda: str | None  # "12.4"
    driver: str | None  # "550.54.15"
    devices: Sequence[Device]  # the visible ones



def driver_facts(driver: Driver, gpus: list[Gpu], need_cuda: bool, need_devices: bool) -> DriverFacts:
    """The facts of ``driver`` the checks need; NVML is asked only when a condition needs it."""
    cuda = None
    devices = []
    if need_cuda or (need_devices and gpus):
        with driver.nvml() as nvml:
            if need_cuda:
                cuda = nvml.cuda_driver_version()
            if need_devices:
                for gpu in gpus:
                    h = nvml.handle_by_uuid(gpu.uuid)
                    devices.append((nvml.compute_capability(h), nvml.brand(h)))
    return DriverFacts(cuda=cuda, driver=driver.version, devices=devices)


class Condition(Record):
    """One ``property op value`` test; ``str()`` gives its canonical text."""

    __slots__ = ("prop", "op", "value")
    prop: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.prop}{self.op}{self.value}" if self.op else self.value

    def holds(self, facts: DriverFacts, device: Device | None) -> bool:
        if self.op == "":  # an unknown property: skipped, as the reference does
            return True
        if self.prop == "brand":
            brand = device[1] if device else None
            if brand is None:
                return True
            return (brand.lower() == self.value) == (self.op == "=")
        if self.prop == "arch":
            have, what = (device[0] if device else None), "device compute capability"
        elif self.prop == "cuda":
            have, what = facts.cuda, "driver CUDA version"
        else:
            have, what = facts.driver, "driver version"
        if have is None:
            return True
        mine = _version_key(have)
        if mine is None:
            raise RequirementError(f"{what} {have!r} is not a version")
        return _compare(mine, self.op, _version_key(self.value))


class Requirement(Record):
    """A parsed expression: alternatives, each a tuple of conditions."""

    __slots__ = ("alternatives",)
    alternatives: tuple[tuple[Condition, ...], ...]

    def __str__(self) -> str:
        return " ".join(",".join(map(str, alt)) for alt in self.alternatives)

    @property
    def properties(self) -> frozenset[str]:
        """The properties tested (``{'cuda', 'brand'}``): which facts to gather."""
        return frozenset(c.prop for alt in self.alternatives for c in alt)

    def satisfied(self, facts: DriverFacts) -> bool:
        return all(self._holds(facts, device) for device in _devices(facts))

    def failures(self, facts: DriverFacts) -> list[str]:
        """``[]`` when satisfied, else the first alternative's conditions:
        the part libnvidia-container names in its error message."""
        if self.satisfied(facts):
            return []
        return [str(c) for c in self.alternatives[0]]

    def _holds(self, facts: DriverFacts, device: Device | None) -> bool:
        if not self.alternatives:
            return True
        return any(all(c.holds(facts, device) for c in alt) for alt in self.alternatives)


def parse(expr: str, *, name: str = "NVIDIA_REQUIRE_CUDA") -> Requirement:
    """Parse ``expr``; ``name`` (its env var) labels errors."""
    if len(expr) > MAX_LENGTH:
        raise RequirementError(f"{name}: longer than {MAX_LENGTH} characters")
    alternatives = []
    for text in expr.split(" "):
        if not text:
            continue
        conditions = tuple(_condition(part, name) for part in text.split(",") if part)
        if not conditions:
            raise RequirementError(f"{name}: empty alternative {_quote(text)}")
        alternatives.append(conditions)
    return Requirement(tuple(alternatives))


def collect(env: Mapping[str, str], *, disable_require: bool = False) -> list[tuple[str, str]]:
    """The ``(variable, expression)`` pairs that apply to an image's env.

    Every ``NVIDIA_REQUIRE_*`` but ``NVIDIA_REQUIRE_JETPACK*``, sorted by
    name; and for legacy images (``CUDA_VERSION`` set, ``NVIDIA_REQUIRE_CUDA``
    empty or unset) ``cuda>=MAJOR.MINOR`` under ``CUDA_VERSION``. Nothing when
    ``NVIDIA_DISABLE_REQUIRE`` is true or ``disable_require`` (the config
    switch) is set; then not even a bad ``CUDA_VERSION`` is an error.
    """
    if disable_require or is_true(env.get(_DISABLE)):
        return []
    pairs = sorted(
        (key, value)
        for key, value in env.items()
        if key.startswith(_PREFIX) and not key.startswith(_JETPACK_PREFIX)
    )
    legacy = env.get(_LEGACY_VERSION)
    if legacy and not env.get(_PREFIX + "CUDA"):
        pairs.append((_LEGACY_VERSION, f"cuda>={_major_minor(legacy)}"))
    return pairs


def _node(facts: DriverFacts) -> str:
    """What this node offers, after the reference's message: what to compare the condition with."""
    if facts.driver and facts.cuda:
        return f" (this node's driver: {facts.driver}, CUDA {facts.cuda})"
    if facts.cuda or facts.driver:
        return f" (this node's driver: {'CUDA ' + facts.cuda if facts.cuda else facts.driver})"
    return ""


def check(env: Mapping[str, str], facts: DriverFacts, *, disable_require: bool = False) -> None:
    """Raise :class:`RequirementError` unless every requirement holds.

    The message is libnvidia-container's, e.g. ``unsatisfied condition:
    cuda>=12.5, please update your driver ...``; the error's ``variable``
    attribute names the env var. ``disable_require`` is the config switch.
    """
    pairs = collect(env, disable_require=disable_require)
    parsed = [(name, parse(expr, name=name)) for name, expr in pairs]
    for name, requirement in parsed:
        failed = requirement.failures(facts)
        if failed:
            text = ",".join(failed)
            hint = _UPDATE_HINT if text.startswith("cuda>=") else ""
            error = RequirementError(f"unsatisfied condition: {text}{hint}{_node(facts)}")
            error.variable = name
            raise error


def explain(
    env: Mapping[str, str], facts: DriverFacts, *, disable_require: bool = False
) -> list[tuple[str, str, list[list[Verdict]]]]:
    """Per requirement: its variable, its text, and each alternative's
    conditions with whether they hold (a device condition holds when it does
    for every visible device)."""
    result = []
    for name, expr in collect(env, disable_require=disable_require):
        requirement = parse(expr, name=name)
        devices = _devices(facts)
        verdicts = [
            [(str(c), all(c.holds(facts, d) for d in devices)) for c in alt]
            for alt in requirement.alternatives
        ]
        result.append((name, expr, verdicts))
    return result


def is_true(value: str | None) -> bool:
    """Whether ``NVIDIA_DISABLE_REQUIRE``'s value means true, in any case."""
    return value is not None and value.lower() in _TRUE


def _devices(facts: DriverFacts) -> Sequence[Device | None]:
    return facts.devices or [None]


def _condition(text: str, name: str) -> Condition:
    start = len(text)
    for char in _OPERATOR_CHARS:
        found = text.find(char)
        if 0 <= found < start:
            start = found
    end = start
    while end < len(text) and text[end] in _OPERATOR_CHARS:
        end += 1
    prop, op, value = text[:start].lower(), text[start:end], text[end:]

    def bad(reason: str) -> RequirementError:
        return RequirementError(f"{name}: invalid condition {_quote(text)}: {reason}")

    if not prop:
        raise bad("missing property")
    if prop not in _PROPERTIES:
        from nvct.base.log import logger

        logger.warning("%s: ignoring condition %s: unknown property %s",
                       name, _quote(text), _quote(text[:start]))
        return Condition(prop, "", text)  # always holds
    if not op:
        raise bad("missing operator")
    if op not in _OPERATORS:
        raise bad(f"unknown operator {_quote(op)}")
    if not value:
        raise bad("missing value")
    if prop == "brand":
        if op not in ("=", "!="):
            raise bad("brand allows only = and !=")
        if not (value.isascii() and value.isprintable()) or any(
            c in _OPERATOR_CHARS for c in value
        ):
            raise bad(f"invalid brand {_quote(value)}")
        return Condition(prop, op, value.lower())
    if _version_key(value) is None:
        raise bad(f"invalid version {_quote(value)}")
    return Condition(prop, op, value)


def _version_key(text: str) -> tuple[int, ...] | None:
    """Numeric components without trailing zeros, or ``None`` if invalid."""
    if len(text) > 64 or not _is_version(text):
        return None
    numbers = [int(part) for part in text.split(".") if part]
    if any(number > _MAX_COMPONENT for number in numbers):
        return None
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...] | None) -> bool:
    assert want is not None  # parse() validated it
    if op == "=":
        return have == want
    if op == "!=":
        return have != want
    if op == "<":
        return have < want
    if op == "<=":
        return have <= want
    if op == ">":
        return have > want
    return have >= want


def _is_version(text: str) -> bool:
    """``[0-9][0-9.]*`` (ASCII digits only, as the expression it replaces)."""
    return bool(text) and text[0] in _DIGITS and all(c in _VERSION_CHARS for c in text)


def _major_minor(version: str) -> str:
    """``CUDA_VERSION`` (loose semver, e.g. ``12.4.1``) as ``MAJOR.MINOR``."""
    parts = _semver(version) if len(version) <= 256 else None
    if (
        parts is None
        or int(parts[0]) >= 2**32
        or int(parts[1] or 0) >= 2**32
        or any(p.isdigit() and len(p) > 1 and p[0] == "0" for p in (parts[2] or "").split("."))
    ):
        raise RequirementError(f"{_LEGACY_VERSION}: invalid CUDA version {_quote(version)}")
    return f"{int(parts[0])}.{int(parts[1] or 0)}"


def _semver(text: str) -> tuple[str, str | None, str | None] | None:
    """(major, minor, prerelease) of libnvidia-container's caller's loose semver, or None.

    ``v?MAJOR(.MINOR)?(.PATCH)?(-PRE(.PRE)*)?(+BUILD(.BUILD)*)?``, numbers ASCII
    digits, identifiers ``[0-9A-Za-z-]+``: checked by hand (no ``re`` on the start path).
    """
    if text.startswith("v"):
        text = text[1:]
    text, plus, build = text.partition("+")
    if plus and not _identifiers(build):
        return None
    cut = text.find("-")
    core, prerelease = (text, None) if cut < 0 else (text[:cut], text[cut + 1:])
    if prerelease is not None and not _identifiers(prerelease):
        return None
    numbers = core.split(".")
    if len(numbers) > 3 or not all(n and all(c in _DIGITS for c in n) for n in numbers):
        return None
    return numbers[0], (numbers[1] if len(numbers) > 1 else None), prerelease


def _identifiers(text: str) -> bool:
    return all(part and all(c in _IDENTIFIER_CHARS for c in part) for part in text.split("."))


def _quote(text: str) -> str:
    """``repr`` of at most 60 characters: safe on one line, whatever it holds."""
    return repr(text if len(text) <= 60 else text[:57] + "...")
