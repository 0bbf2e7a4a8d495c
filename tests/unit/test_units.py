import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptbench import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [("140GB", 140 * 10**9), ("1.5GiB", 3 * 2**29), ("4k", 4096), ("4KiB", 4096), ("4kB", 4000),
     ("4096", 4096), (" 2 MiB ", 2 * 2**20), ("1TB", 10**12), ("1e3", 1000), (4096, 4096)],
)
def test_parse_size(text, expected):
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "-1GB", "0", "0B", "1.5XB", "GB", "1 G B", True])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="size"):
        units.parse_size(bad)


@pytest.mark.parametrize(("text", "expected"), [("1.5GiB", 3 * 2**29), ("2.0", 2), ("1.3k", 1331), ("0.5KiB", 512),
                                                ("1.5e3", 1500), (4096.0, 4096)])
def test_a_fraction_of_a_larger_unit_rounds_to_the_nearest_byte(text, expected):
    assert units.parse_size(text) == expected


@pytest.mark.parametrize(("bad", "guess"), [("1.5", True), (1.5, True), ("1.5B", False), (" 1.5 B ", False)])
def test_a_fraction_of_a_byte_is_refused(bad, guess):
    """A bare number is likely a forgotten unit (a guess is offered); explicit bytes are not."""
    with pytest.raises(ValueError, match=r"is not a whole number of bytes(; did you mean 1\.5GiB\?)?$") as err:
        units.parse_size(bad)
    assert ("did you mean" in str(err.value)) == guess


@pytest.mark.parametrize(("bad", "instead"), [
    ("1Gb", "1GB or 1GiB"), ("1gb", "1GB or 1GiB"), ("4kb", "4kB or 4KiB"), ("2 Mb", "2MB or 2MiB"), ("512b", "512B"),
    ("1Gib", "1GiB"), ("1Gbit", "1GB or 1GiB"), ("3Tbits", "3TB or 3TiB"),
])
def test_a_size_in_bits_is_refused_with_the_byte_spelling(bad, instead):
    """A lowercase b is a bit, in sizes as in rates; a size is bytes, so it is refused, never read as bytes."""
    with pytest.raises(ValueError, match=f"is in bits; sizes are in bytes \\(B, not b\\): write {instead}$"):
        units.parse_size(bad)


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [("1GB/s", 1e9), ("10Gbit/s", 1.25e9), ("10Gbps", 1.25e9), ("10Gb/s", 1.25e9), ("800MiB/s", 800 * 2**20),
     ("1.5 GB/s", 1.5e9), ("100MB/s", 1e8), ("1B/s", 1.0), ("1Gbits/s", 1.25e8), ("1Gib/s", 2**30 / 8)],
)
def test_parse_rate(text, bytes_per_s):
    assert units.parse_rate(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("bad", ["1GB", "fast", "0GB/s", "-1GB/s", "1iB/s", "/s"])
def test_parse_rate_rejects(bad):
    with pytest.raises(ValueError, match="rate"):
        units.parse_rate(bad)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800), ("2h", 7200), ("500ms", 0.5), ("1d", 86400), ("140s", 140), ("1h30m", 5400), ("90", 90),
     ("50000h", 50000 * 3600), ("1.5h", 5400), ("250us", 250e-6), ("1 h 30 m", 5400)],
)
def test_parse_duration(text, seconds):
    assert units.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "soon", "0s", "-5m", "5 parsecs", "1h30", "m30"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="duration"):
        units.parse_duration(bad)


@pytest.mark.parametrize(("bad", "part", "problem"), [
    ("1m1m", "1m", "repeats a unit"), ("1h 1h", "1h", "repeats a unit"), ("1m1min", "1min", "repeats a unit"),
    ("2h30m30m", "30m", "repeats a unit"), ("30m1h", "1h", "comes after a smaller unit"),
    ("1s1d", "1d", "comes after a smaller unit"),
])
def test_parse_duration_refuses_a_repeated_or_misordered_unit(bad, part, problem):
    with pytest.raises(ValueError, match=f"^'{bad}' is not a duration: '{part}' {problem} \\(give each unit once"):
        units.parse_duration(bad)


@pytest.mark.parametrize(("text", "value"), [("70B", 7e10), ("20T", 2e13), ("4000", 4000), ("1.5k", 1500), ("8e9", 8e9)])
def test_parse_count(text, value):
    assert units.parse_count(text) == value


@pytest.mark.parametrize(("text", "value"), [("2%", 0.02), ("0.35", 0.35), ("100%", 1.0), ("1", 1.0)])
def test_parse_fraction(text, value):
    assert units.parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["0", "1.2", "-3%", "150%", "x"])
def test_parse_fraction_rejects(bad):
    with pytest.raises(ValueError):
        units.parse_fraction(bad)


def test_parse_list():
    assert units.parse_list("1,2,4", int) == [1, 2, 4]
    assert units.parse_list([1, 2], int) == [1, 2]
    with pytest.raises(ValueError):
        units.parse_list(",", int)


def test_format_size_and_rate():
    assert units.format_size(2**30) == "1 GiB"
    assert units.format_size(3 * 2**29) == "1.5 GiB"
    assert units.format_size(512) == "512 B"
    assert units.format_size(1.4e11, binary=False) == "140 GB"
    assert units.format_rate(1.5e9) == "1.50 GB/s"
    assert units.format_rate(1.25e9, "Gbit/s") == "10.00 Gbit/s"
    with pytest.raises(ValueError):
        units.format_rate(1, "furlongs/s")


def test_format_duration():
    assert units.format_duration(0.0005) == "500 µs"
    assert units.format_duration(0.25) == "250 ms"
    assert units.format_duration(140) == "2m 20s"
    assert units.format_duration(3599.9) == "1h"
    assert units.format_duration(93600) == "1d 2h"


@given(st.integers(min_value=1, max_value=2**60), st.booleans())
def test_size_round_trip(nbytes, binary):
    text = units.format_size(nbytes, binary=binary, digits=6)
    assert math.isclose(units.parse_size(text.replace(" ", "")), nbytes, rel_tol=1e-5, abs_tol=1)


@given(st.floats(min_value=1e-3, max_value=1e7, allow_nan=False))
def test_duration_round_trip(seconds):
    back = units.parse_duration(units.format_duration(seconds).replace("µs", "us"))
    # 3 significant figures below a minute; above, two units ("2h 5m"), so half the smaller one.
    half_unit = 1800 if seconds >= 86400 else 30 if seconds >= 3600 else 0.5 if seconds >= 60 else 0
    assert math.isclose(back, seconds, rel_tol=0.01, abs_tol=half_unit + 1e-9)


@given(st.floats(min_value=1e6, max_value=1e13, allow_nan=False))
def test_rate_round_trip(bytes_per_s):
    for unit in ("GB/s", "MiB/s", "Gbit/s"):
        text = units.format_rate(bytes_per_s, unit, digits=12)
        assert math.isclose(units.parse_rate(text), bytes_per_s, rel_tol=1e-6)
