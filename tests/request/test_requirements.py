from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from nvct.base.errors import RequirementError
from nvct.request import requirements
from nvct.request.requirements import Condition, DriverFacts, Requirement, check, collect, explain, parse

# NVIDIA_REQUIRE_CUDA of nvidia/cuda:12.4.1-base-ubuntu22.04 (abridged: the real
# value repeats the brand list for drivers 470, 525 and 535).
CUDA_12_4 = (
    "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
    "brand=nvidia,driver>=470,driver<471 brand=nvidiartx,driver>=470,driver<471 "
    "brand=geforce,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471 "
    "brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 "
    "brand=titan,driver>=470,driver<471 brand=titanrtx,driver>=470,driver<471 "
    "brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526 "
    "brand=tesla,driver>=535,driver<536 brand=unknown,driver>=535,driver<536"
)
HINT = ", please update your driver to a newer version, or use an earlier cuda container"


def facts(cuda="12.4", driver="550.54.15", devices=(("9.0", "tesla"),)):
    return DriverFacts(cuda=cuda, driver=driver, devices=list(devices))


# --- grammar -------------------------------------------------------------------


def test_parse_builds_alternatives_of_conditions():
    assert parse("cuda>=12.4 brand=tesla,driver>=470") == Requirement(
        (
            (Condition("cuda", ">=", "12.4"),),
            (Condition("brand", "=", "tesla"), Condition("driver", ">=", "470")),
        )
    )


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("", ""),
        ("   ", ""),
        ("cuda>=12.4", "cuda>=12.4"),
        ("CUDA>=12.4 Brand=Tesla", "cuda>=12.4 brand=tesla"),
        ("  cuda>=12.4   brand=tesla,,driver>=470,  ", "cuda>=12.4 brand=tesla,driver>=470"),
        (",cuda>=12.4", "cuda>=12.4"),
        ("arch=9.0 arch!=8.6 arch<9 arch<=9 arch>7.5", "arch=9.0 arch!=8.6 arch<9 arch<=9 arch>7.5"),
        ("driver>=550.54.15", "driver>=550.54.15"),
        ("cuda>=12..4 cuda>12.", "cuda>=12..4 cuda>12."),  # accepted by the reference too
        ("brand!=geforce", "brand!=geforce"),
        (CUDA_12_4, CUDA_12_4),
    ],
)
def test_canonical_text(text, canonical):
    assert str(parse(text)) == canonical
    assert parse(canonical) == parse(text)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("cuda", "missing operator"),
        (">=12", "missing property"),
        ("cuda>=", "missing value"),
        ("cuda=>12", "unknown operator '=>'"),
        ("cuda==12", "unknown operator '=='"),
        ("cuda!12", "unknown operator '!'"),
        ("cuda>=12.4a", "invalid version '12.4a'"),
        ("cuda>=.4", "invalid version '.4'"),
        ("cuda>=-1", "invalid version '-1'"),
        ("cuda>=12>4", "invalid version '12>4'"),
        ("cuda>=99999999999999999999", "invalid version"),
        ("driver>=\u0665", "invalid version"),  # an Arabic-Indic digit
        ("brand<tesla", "brand allows only = and !="),
        ("brand>=tesla", "brand allows only = and !="),
        ("brand=tes=la", "invalid brand 'tes=la'"),
        ("brand=tesla\t", "invalid brand"),
        ("cuda>=12.4 ,,", "empty alternative ',,'"),
    ],
)
def test_malformed_expressions_name_the_variable_and_token(text, reason):
    with pytest.raises(RequirementError) as info:
        parse(text, name="NVIDIA_REQUIRE_X")
    message = str(info.value)
    assert message.startswith("NVIDIA_REQUIRE_X: ")
    assert reason in message
    assert "\n" not in message


def test_malformed_token_is_quoted_safely():
    with pytest.raises(RequirementError) as info:
        parse("cuda>=1\n2" + "x" * 200)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


def test_overlong_expression_is_refused():
    with pytest.raises(RequirementError, match=r"^NVIDIA_REQUIRE_CUDA: longer than 4096 characters$"):
        parse("cuda>=1 " * 600)


# --- semantics -------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, cuda, ok",
    [
        ("cuda>=12.4", "12.4", True),
        ("cuda>=12.10", "12.4", False),  # numeric, not lexical
        ("cuda>12.4", "12.10", True),
        ("cuda=12", "12.0", True),  # missing components count as zero
        ("cuda=12.0.0", "12", True),
        ("cuda!=12.0", "12", False),
        ("cuda<12.0.1", "12", True),
        ("cuda<=12.4", "12.4", True),
        ("cuda<12.4", "12.4", False),
        ("cuda=12.04", "12.4", True),  # components are numbers
        ("cuda>=12.5", None, True),  # unknown fact: holds
    ],
)
def test_cuda_versions(expr, cuda, ok):
    assert parse(expr).satisfied(facts(cuda=cuda)) is ok


@pytest.mark.parametrize(
    "expr, ok",
    [
        ("driver>=550.54.15", True),
        ("driver>550.54.14", True),
        ("driver>=550.54.16", False),
        ("driver>=470,driver<471", False),
        ("driver>=550,driver<551", True),
    ],
)
def test_driver_versions(expr, ok):
    assert parse(expr).satisfied(facts()) is ok


def test_brand_compares_case_insensitively():
    assert parse("brand=TESLA").satisfied(facts(devices=[("9.0", "Tesla")]))
    assert not parse("brand!=tesla").satisfied(facts(devices=[("9.0", "TESLA")]))
    assert parse("brand=geforce").satisfied(facts(devices=[("9.0", None)]))  # unknown brand


def test_device_conditions_hold_without_devices():
    assert parse("arch>=9.0,brand=quadro").satisfied(facts(devices=[]))


def test_arch_must_hold_on_every_visible_device():
    two = facts(devices=[("9.0", "tesla"), ("7.5", "tesla")])
    assert not parse("arch>=8.0").satisfied(two)
    assert parse("arch>=7.5").satisfied(two)


def test_each_device_may_satisfy_a_different_alternative():
    # libnvidia-container evaluates the whole expression once per device.
    mixed = facts(devices=[("9.0", "tesla"), ("8.6", "geforce")])
    assert parse("brand=tesla brand=geforce").satisfied(mixed)
    assert not parse("brand=tesla").satisfied(mixed)


def test_empty_expression_is_satisfied():
    assert parse("").failures(facts()) == []


def test_real_cuda_image_requirement():
    requirement = parse(CUDA_12_4)
    assert requirement.failures(facts(cuda="12.4")) == []
    assert requirement.failures(facts(cuda="12.2", driver="470.57.02")) == []  # forward compat branch
    assert requirement.failures(facts(cuda="12.2", driver="470.57.02", devices=[("8.6", "geforce")])) == []
    assert requirement.failures(facts(cuda="12.2", driver="535.104.05", devices=[("8.6", "geforce")])) == [
        "cuda>=12.4"
    ]
    assert requirement.failures(facts(cuda="12.2", driver="535.104.05")) == []  # tesla on 535


def test_failures_name_the_first_alternative_whole():
    requirement = parse("cuda>=12.5,arch>=9.0 driver>=999")
    assert requirement.failures(facts()) == ["cuda>=12.5", "arch>=9.0"]


def test_invalid_fact_is_an_error():
    with pytest.raises(RequirementError, match="driver version 'N/A' is not a version"):
        parse("driver>=470").satisfied(facts(driver="N/A"))


# --- env: collect / check / explain --------------------------------------------------


def test_collect_every_require_variable_sorted_without_jetpack():
    env = {
        "NVIDIA_REQUIRE_CUDA": "cuda>=12.4",
        "NVIDIA_REQUIRE_ARCH": "arch>=8.0",
        "NVIDIA_REQUIRE_JETPACK": "csv-mounts=all",
        "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS": "",
        "CUDA_VERSION": "12.4.1",
        "PATH": "/usr/bin",
    }
    assert collect(env) == [("NVIDIA_REQUIRE_ARCH", "arch>=8.0"), ("NVIDIA_REQUIRE_CUDA", "cuda>=12.4")]


@pytest.mark.parametrize(
    "cuda_version, expected",
    [
        ("10.0.130", "cuda>=10.0"),
        ("9.0", "cuda>=9.0"),
        ("11", "cuda>=11.0"),
        ("v11.2.1", "cuda>=11.2"),
        ("012.04", "cuda>=12.4"),
        ("12.4.1-rc1", "cuda>=12.4"),
        ("12.4.1+build.7", "cuda>=12.4"),
    ],
)
def test_legacy_cuda_version(cuda_version, expected):
    assert collect({"CUDA_VERSION": cuda_version}) == [("CUDA_VERSION", expected)]
    # An empty NVIDIA_REQUIRE_CUDA does not count as set.
    pairs = collect({"CUDA_VERSION": cuda_version, "NVIDIA_REQUIRE_CUDA": ""})
    assert pairs == [("NVIDIA_REQUIRE_CUDA", ""), ("CUDA_VERSION", expected)]


def test_legacy_rule_yields_to_require_cuda():
    assert collect({"CUDA_VERSION": "9.0", "NVIDIA_REQUIRE_CUDA": "cuda>=9.2"}) == [
        ("NVIDIA_REQUIRE_CUDA", "cuda>=9.2")
    ]
    assert collect({"CUDA_VERSION": ""}) == []


@pytest.mark.parametrize("bad", ["abc", "12.4.1-01", "1.2.3.4", "99999999999.0", "12.4 ", "12.x"])
def test_legacy_invalid_cuda_version(bad):
    with pytest.raises(RequirementError, match=r"^CUDA_VERSION: invalid CUDA version"):
        collect({"CUDA_VERSION": bad})


@pytest.mark.parametrize("value", ["1", "true", "True", "TRUE", "t", "T", "yes", "YES", "on", "On", "tRuE"])
def test_disable_require_true_spellings(value):
    env = {"NVIDIA_DISABLE_REQUIRE": value, "NVIDIA_REQUIRE_CUDA": "cuda>=99", "CUDA_VERSION": "bad"}
    assert collect(env) == []
    check(env, facts())


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", " 1", "y"])
def test_disable_require_other_values_do_not_disable(value):
    env = {"NVIDIA_DISABLE_REQUIRE": value, "NVIDIA_REQUIRE_CUDA": "cuda>=99"}
    assert collect(env) == [("NVIDIA_REQUIRE_CUDA", "cuda>=99")]


def test_check_passes_when_satisfied():
    check({"NVIDIA_REQUIRE_CUDA": CUDA_12_4, "NVIDIA_REQUIRE_ARCH": "arch>=8.0"}, facts())


def test_check_uses_the_reference_wording_for_cuda():
    with pytest.raises(RequirementError) as info:
        check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.5 brand=tesla,driver>=470,driver<471"}, facts())
    # The reference's words, then what the node has to compare with.
    assert str(info.value) == "unsatisfied condition: cuda>=12.5" + HINT + " (this node's driver: 550.54.15, CUDA 12.4)"
    assert info.value.variable == "NVIDIA_REQUIRE_CUDA"


def test_a_failure_says_the_drivers_cuda_version_where_known():
    with pytest.raises(RequirementError) as info:
        check({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}, facts(driver=None))
    assert str(info.value).endswith(HINT + " (this node's driver: CUDA 12.4)")
    with pytest.raises(RequirementError) as info:
        check({"NVIDIA_REQUIRE_DRIVER": "driver>=999"}, facts(cuda=None))
    assert str(info.value) == "unsatisfied condition: driver>=999 (this node's driver: 550.54.15)"


def test_check_without_cuda_hint():
    with pytest.raises(RequirementError) as info:
        check({"NVIDIA_REQUIRE_ARCH": "arch>=9.0,brand=tesla"}, facts(devices=[("8.0", "tesla")]))
    assert str(info.value) == "unsatisfied condition: arch>=9.0,brand=tesla (this node's driver: 550.54.15, CUDA 12.4)"


def test_check_legacy_image():
    with pytest.raises(RequirementError, match=r"^unsatisfied condition: cuda>=12\.6, please update"):
        check({"CUDA_VERSION": "12.6.0"}, facts())


def test_check_reports_malformed_before_unsatisfied():
    env = {"NVIDIA_REQUIRE_A": "cuda>=99", "NVIDIA_REQUIRE_Z": "cuda=>1"}
    with pytest.raises(RequirementError, match=r"^NVIDIA_REQUIRE_Z: invalid condition"):
        check(env, facts())


def test_config_disable_require_skips_everything():
    env = {"NVIDIA_REQUIRE_CUDA": "nonsense", "CUDA_VERSION": "bad"}
    check(env, facts(), disable_require=True)
    assert collect(env, disable_require=True) == []
    assert explain(env, facts(), disable_require=True) == []


def test_properties_say_which_facts_are_needed():
    assert parse("CUDA>=12.4 Brand=tesla,driver>=470").properties == {"cuda", "brand", "driver"}
    assert parse("").properties == frozenset()


def test_explain_gives_each_condition_verdict():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.5 brand=tesla,driver>=550"}
    assert explain(env, facts()) == [
        (
            "NVIDIA_REQUIRE_CUDA",
            "cuda>=12.5 brand=tesla,driver>=550",
            [[("cuda>=12.5", False)], [("brand=tesla", True), ("driver>=550", True)]],
        )
    ]
    assert explain({"NVIDIA_DISABLE_REQUIRE": "1", "NVIDIA_REQUIRE_CUDA": "x"}, facts()) == []


# --- properties ----------------------------------------------------------------------

_ALPHABET = st.sampled_from(list("cudarivebn<>=!., 0123456789\t\n\x00éTESLA") + ["cuda", "brand", "driver", "arch"])
_PROPERTIES = st.sampled_from(["cuda", "driver", "arch", "CUDA", "Driver"])
_VERSIONS = st.from_regex(r"[0-9]{1,3}(\.[0-9]{0,3}){0,3}", fullmatch=True)
_BRANDS = st.sampled_from(["tesla", "Tesla", "geforce", "nvidiartx", "unknown", "quadro", "titan"])


@st.composite
def _conditions(draw):
    if draw(st.booleans()):
        return draw(_PROPERTIES) + draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">="])) + draw(_VERSIONS)
    return "brand" + draw(st.sampled_from(["=", "!="])) + draw(_BRANDS)


_EXPRESSIONS = st.lists(
    st.lists(_conditions(), min_size=1, max_size=4).map(",".join), max_size=5
).map(" ".join)
_FACTS = st.builds(
    DriverFacts,
    cuda=st.one_of(st.none(), _VERSIONS),
    driver=st.one_of(st.none(), _VERSIONS),
    devices=st.lists(st.tuples(st.one_of(st.none(), _VERSIONS), st.one_of(st.none(), _BRANDS)), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=300).map("".join), _FACTS)
def test_arbitrary_text_only_raises_requirement_error(text, driver_facts):
    parse_or_refuse(text, driver_facts)  # and within a second: tests/perf/test_request.py


def parse_or_refuse(text, driver_facts):
    try:
        requirement = parse(text, name="NVIDIA_REQUIRE_FUZZ")
    except RequirementError as e:
        assert str(e).startswith("NVIDIA_REQUIRE_FUZZ: ") and "\n" not in str(e)
    else:
        requirement.failures(driver_facts)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=5000))
def test_arbitrary_unicode_only_raises_requirement_error(text):
    try:
        parse(text)
    except RequirementError:
        pass


@settings(max_examples=200, deadline=None)
@given(_EXPRESSIONS, _FACTS)
def test_round_trip_of_valid_expressions(text, driver_facts):
    requirement = parse(text)
    again = parse(str(requirement))
    assert again == requirement
    assert str(again) == str(requirement)
    assert again.failures(driver_facts) == requirement.failures(driver_facts)


_ENV_KEYS = st.sampled_from(["CUDA_VERSION", "NVIDIA_REQUIRE_CUDA", "NVIDIA_DISABLE_REQUIRE", "NVIDIA_REQUIRE_X"])


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_ENV_KEYS, st.text(max_size=40)), _FACTS)
def test_check_on_arbitrary_env_only_raises_requirement_error(env, driver_facts):
    try:
        check(env, driver_facts)
    except RequirementError as e:
        assert "\n" not in str(e)


def test_max_length_is_public():
    assert requirements.MAX_LENGTH == 4096


def test_unknown_property_is_skipped_with_a_warning_and_known_ones_still_checked(capsys):
    from nvct.base.log import logger

    logger.setup(stderr=True)
    try:
        check({"NVIDIA_REQUIRE_CUDA": "cuda>=11.6 foo=bar"}, facts())
        with pytest.raises(RequirementError, match=r"^unsatisfied condition: cuda>=99,foo=bar"):
            check({"NVIDIA_REQUIRE_CUDA": "cuda>=99,foo=bar"}, facts())
    finally:
        logger.setup()
    assert "NVIDIA_REQUIRE_CUDA: ignoring condition 'foo=bar': unknown property 'foo'" in capsys.readouterr().err


# The start path parses versions by hand; these are the expressions it replaced.
_SEMVER_RE = (r"v?([0-9]+)(?:\.([0-9]+))?(?:\.[0-9]+)?"
              r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
              r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?")
_VERSION_ALPHABET = st.text(alphabet="0123456789.-+vVaZ_٣ ", max_size=14)


@settings(max_examples=3000)
@given(_VERSION_ALPHABET)
def test_semver_by_hand_matches_the_expression(text):
    import re

    match = re.fullmatch(_SEMVER_RE, text)
    expected = (match.group(1), match.group(2), match.group(3)) if match else None
    assert requirements._semver(text) == expected


@settings(max_examples=3000)
@given(_VERSION_ALPHABET)
def test_version_check_by_hand_matches_the_expression(text):
    import re

    assert requirements._is_version(text) == bool(re.fullmatch(r"[0-9][0-9.]*", text))


def test_import_pulls_no_re_dataclasses_or_typing():
    import subprocess
    import sys

    code = ("import sys; import nvct.request.requirements;"
            "print(' '.join(m for m in ('re', 'dataclasses', 'typing', 'enum') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []
