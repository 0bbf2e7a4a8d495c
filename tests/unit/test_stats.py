"""The tie rule: "best" only beyond the noise of both candidates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptbench.bench.stats import beats, leaders


def test_separated_ranges_have_one_winner():
    assert beats([2.0, 2.1, 2.2], [1.0, 1.5, 1.9])
    assert leaders([[1.0, 1.5, 1.9], [2.0, 2.1, 2.2]]) == [1]


def test_overlapping_ranges_are_tied_best_median_first():
    # the 52 % spread of the issue: 4 threads' median is higher, but its runs overlap 2 threads' runs
    two, four = [0.81, 0.88, 1.17], [0.70, 1.20, 1.25]
    assert not beats(four, two) and not beats(two, four)
    assert leaders([two, four]) == [1, 0]


def test_a_single_run_never_wins_or_loses():
    assert not beats([5.0], [1.0, 1.1]) and not beats([5.0, 5.1], [1.0])
    assert leaders([[1.0], [5.0]]) == [1, 0]


def test_lower_is_better_for_times():
    assert beats([0.1, 0.12], [0.2, 0.3], higher_is_better=False)
    assert leaders([[0.2, 0.3], [0.1, 0.12], [0.11, 0.25]], higher_is_better=False) == [1, 2]


def test_no_candidates():
    with pytest.raises(ValueError):
        leaders([])


samples = st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=5)


@given(st.lists(samples, min_size=1, max_size=6))
def test_leaders_are_exactly_those_the_top_does_not_beat(candidates):
    out = leaders(candidates)
    top = out[0]
    assert sorted(out[1:] + [top]) == sorted(set(out))
    for i in range(len(candidates)):
        assert (i in out) == (i == top or not beats(candidates[top], candidates[i]))
