"""The S3 data path's concurrency controller (AIMD) and its request counts, with a fake clock."""

from __future__ import annotations

import threading

import pytest

from ckptbench.storage.s3_pacing import RESTORE_AFTER_S, Aimd, RequestStats, is_throttle, totals


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


def test_starts_at_the_ceiling_and_a_throttle_halves_it():
    clock = Clock()
    aimd = Aimd(16, clock=clock)
    assert aimd.limit == 16
    started = aimd.acquire()
    clock.tick()
    aimd.throttled(started)
    aimd.release()
    assert aimd.limit == 8 and aimd.decreases == 1


def test_throttles_of_requests_started_before_the_decrease_count_once():
    """Requests already in flight when the limit came down answer with the same congestion."""
    clock = Clock()
    aimd = Aimd(16, clock=clock)
    starts = [aimd.acquire() for _ in range(8)]
    clock.tick()
    for started in starts:
        aimd.throttled(started)
    assert aimd.limit == 8 and aimd.decreases == 1
    clock.tick()
    aimd.throttled(clock.tick())  # a request sent after the decrease: a new congestion event
    assert aimd.limit == 4 and aimd.decreases == 2


def lowered(aimd: Aimd, clock: Clock, times: int) -> Aimd:
    """``aimd`` after ``times`` throttles, each of a request sent after the previous decrease."""
    for _ in range(times):
        aimd.throttled(clock.tick())
    return aimd


def test_never_below_the_floor():
    clock = Clock()
    aimd = lowered(Aimd(8, clock=clock), clock, 10)
    assert aimd.limit == 1 and aimd.lowest == 1
    assert lowered(Aimd(8, floor=2, clock=clock), clock, 10).limit == 2


def test_additive_increase_one_slot_per_round_of_successes_up_to_the_ceiling():
    clock = Clock()
    aimd = lowered(Aimd(8, clock=clock), clock, 2)
    assert aimd.limit == 2
    aimd.succeeded()
    assert aimd.limit == 2  # half a slot so far
    aimd.succeeded()
    assert aimd.limit == 3  # two successes at a limit of two: one slot more
    for _ in range(3):
        aimd.succeeded()
    assert aimd.limit == 4
    for _ in range(200):
        aimd.succeeded()
    assert aimd.limit == 8  # the configured concurrency is the ceiling


def test_acquire_waits_while_the_limit_is_in_flight():
    clock = Clock()
    aimd = lowered(Aimd(4, clock=clock), clock, 2)  # limit 1
    first = aimd.acquire()
    assert first is not None and aimd.in_flight == 1
    got: list[float | None] = []
    waiter = threading.Thread(target=lambda: got.append(aimd.acquire()))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got  # no second slot at a limit of one
    aimd.release()
    waiter.join(5)
    assert got and got[0] is not None and aimd.in_flight == 1


def test_a_stopped_transfer_stops_waiting():
    aimd = Aimd(1)
    aimd.acquire()
    assert aimd.acquire(stopped=lambda: True) is None
    with aimd.slot(stopped=lambda: True) as started:
        assert started is None
    assert aimd.in_flight == 1


def test_a_new_ceiling_is_followed_unless_the_limit_was_learned():
    clock = Clock()
    aimd = Aimd(8, clock=clock)
    aimd.set_ceiling(32)
    assert aimd.limit == 32
    aimd.throttled(clock.tick())
    assert aimd.limit == 16
    aimd.set_ceiling(64)
    assert aimd.limit == 16  # what recent throttling taught stays, and grows back from there
    aimd.set_ceiling(4)
    assert aimd.limit == 4


def test_a_transfer_long_after_the_last_throttle_starts_at_the_ceiling():
    clock = Clock()
    aimd = lowered(Aimd(8, clock=clock), clock, 2)
    assert aimd.limit == 2
    clock.tick(RESTORE_AFTER_S / 2)
    aimd.set_ceiling(8)
    assert aimd.limit == 2
    clock.tick(RESTORE_AFTER_S)
    aimd.set_ceiling(8)
    assert aimd.limit == 8


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Aimd(0)
    with pytest.raises(ValueError):
        Aimd(4, decrease=1.0)


@pytest.mark.parametrize(("status", "code", "throttle"), [
    (503, "SlowDown", True), (503, None, True), (429, None, True), (400, "Throttling", True),
    (500, "InternalError", False), (404, "NoSuchKey", False), (200, None, False)])
def test_what_counts_as_throttling(status, code, throttle):
    assert is_throttle(status, code) is throttle


def test_counts_add_up_per_connection_and_in_the_process_total():
    before = totals()
    stats = RequestStats()
    stats.add(requests=3, throttled=2, retries=2, retry_s=0.5)
    stats.add(requests=1, errors=1, retries=1, retry_s=0.25)
    own = stats.snapshot()
    assert (own.requests, own.throttled, own.retries, own.errors) == (4, 2, 3, 1)
    assert own.retry_s == pytest.approx(0.75)
    delta = totals().minus(before)
    assert delta.requests >= 4 and delta.throttled >= 2
    assert own.to_dict()["retry_s"] == 0.75


def test_a_throttle_of_an_unknown_request_stands_for_the_oldest_in_flight():
    """Clients with their own event loop cannot say which request was throttled: one decrease per round."""
    clock = Clock()
    aimd = Aimd(16, clock=clock)
    old = aimd.acquire()
    clock.tick()
    aimd.throttled()
    aimd.throttled()  # the same round: the oldest in flight started before the decrease
    assert aimd.limit == 8
    aimd.release(old)
    clock.tick()
    aimd.acquire()
    clock.tick()
    aimd.throttled()
    assert aimd.limit == 4
