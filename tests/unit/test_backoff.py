"""The one retry backoff policy (`asyncdapo.runtime.backoff`): its sequence, cap, jitter and the
loop helper, and the named policies of the services keeping their numbers."""

from __future__ import annotations

import itertools
import random

import pytest

from asyncdapo.runtime.backoff import Backoff, Jitter


def test_the_wait_doubles_from_first_up_to_the_cap() -> None:
    b = Backoff(0.1, 2.0)
    assert [b.delay(n) for n in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert [Backoff(1.0, 100.0, factor=3.0).delay(n) for n in range(6)] == [1.0, 3.0, 9.0, 27.0, 81.0, 100.0]
    assert [Backoff(0.5, 0.5, factor=1.0).delay(n) for n in range(3)] == [0.5, 0.5, 0.5]


def test_a_very_late_attempt_is_the_cap_not_an_overflow() -> None:
    assert Backoff(0.1, 2.0).delay(5000) == 2.0
    assert Backoff(1.0, 30.0, factor=1e10).delay(100) == 30.0


@pytest.mark.parametrize(
    ("jitter", "low", "high"),
    [(Jitter.FULL, 0.0, 1.0), (Jitter.EQUAL, 0.5, 1.0), (Jitter.SPREAD, 0.5, 1.5)],
)
def test_jitter_spreads_each_capped_wait_within_its_bounds(jitter: Jitter, low: float, high: float) -> None:
    b = Backoff(0.25, 4.0, jitter=jitter)
    rng = random.Random(3)
    for attempt in (0, 2, 10):  # below the cap, at 1 s, capped at 4 s
        d = b.capped(attempt)
        draws = [b.delay(attempt, rng) for _ in range(400)]
        assert all(low * d <= x <= high * d for x in draws)
        span = (high - low) * d  # the draws fill the interval, not one point of it
        assert min(draws) < low * d + 0.1 * span and max(draws) > high * d - 0.1 * span


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    b = Backoff(0.1, 2.0, jitter=Jitter.FULL)
    assert [b.delay(n, random.Random(9)) for n in range(5)] == [
        b.delay(n, random.Random(9)) for n in range(5)
    ]
    # one draw per wait, the verifier client's full-jitter draw: uniform(0, capped)
    rng, ref = random.Random(11), random.Random(11)
    assert [b.delay(n, rng) for n in range(8)] == [ref.uniform(0.0, min(2.0, 0.1 * 2**n)) for n in range(8)]


def test_delays_counts_the_waits_and_starts_over_on_reset() -> None:
    delays = Backoff(1.0, 10.0).delays()
    assert [delays.next() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert delays.attempt == 5
    delays.reset()
    assert delays.next() == 1.0
    assert list(itertools.islice(delays, 3)) == [2.0, 4.0, 8.0]  # an endless iterator too


@pytest.mark.parametrize(
    "kwargs",
    [
        {"first_s": 0.0, "max_s": 1.0},
        {"first_s": 2.0, "max_s": 1.0},
        {"first_s": 0.1, "max_s": 1.0, "factor": 0.5},
    ],
)
def test_a_policy_that_cannot_back_off_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="Backoff needs"):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_a_negative_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match="attempt must be >= 0"):
        Backoff(0.1, 1.0).delay(-1)


def _doubling(first: float, cap: float, n: int) -> list[float]:
    """The loop every site wrote by hand: `delay = first`, then `delay = min(delay * 2, cap)`."""
    out, d = [], first
    for _ in range(n):
        out.append(d)
        d = min(d * 2, cap)
    return out


def test_the_services_policies_reproduce_their_hand_written_loops() -> None:
    """Each site's waits (before jitter) are the ones its own loop produced."""
    from asyncdapo.runtime.verifier_client import VERIFIER_RETRY_BACKOFF
    from asyncdapo.services.gateway.cli import START_WEIGHTS_BACKOFF
    from asyncdapo.services.scheduler.gateway_pool import WATCH_RECONNECT_BACKOFF
    from asyncdapo.services.scheduler.rollout import QUEUE_POLL_MAX_S, SCHEDULER_REDIS_BACKOFF
    from asyncdapo.services.scheduler.streamed_tokenizer import TOKENIZER_FETCH_BACKOFF
    from asyncdapo.services.scheduler.weight_publisher import SYNC_BACKOFF
    from asyncdapo.services.trainer.publish import PUBLISH_RETRY_BACKOFF
    from asyncdapo.services.trainer.redis_io import TRAINER_REDIS_BACKOFF
    from asyncdapo.services.verifier.worker_pool import RESPAWN_BACKOFF
    from asyncdapo.tools.local.supervisor import CRASH_BACKOFF

    n = 12
    loops = [
        (VERIFIER_RETRY_BACKOFF, _doubling(0.1, 2.0, n)),
        (START_WEIGHTS_BACKOFF, _doubling(1.0, 30.0, n)),
        (WATCH_RECONNECT_BACKOFF, _doubling(0.05, 2.0, n)),
        (SCHEDULER_REDIS_BACKOFF, _doubling(0.05, 2.0, n)),
        (Backoff(0.05, QUEUE_POLL_MAX_S), _doubling(0.05, 0.25, n)),  # the admission poll at its default
        (TOKENIZER_FETCH_BACKOFF, _doubling(1.0, 30.0, n)),
        (
            SYNC_BACKOFF,
            _doubling(0.5, 30.0, n + 1)[1:],
        ),  # per gateway: doubled from 0.5 s before the first wait
        (PUBLISH_RETRY_BACKOFF, _doubling(0.5, 10.0, n)),
        (TRAINER_REDIS_BACKOFF, _doubling(0.1, 2.0, n)),
        (CRASH_BACKOFF, [min(10.0, 1.0 * 2**c) for c in range(n)]),
        (RESPAWN_BACKOFF, [min(0.1 * 2**streak, 10.0) for streak in range(1, n + 1)]),  # streak 0: no wait
    ]
    for policy, waits in loops:
        assert [policy.capped(k) for k in range(n)] == waits, policy
    assert VERIFIER_RETRY_BACKOFF.jitter is Jitter.FULL
    assert SCHEDULER_REDIS_BACKOFF.jitter is SYNC_BACKOFF.jitter is Jitter.EQUAL  # d * (0.5 + r / 2)
    assert WATCH_RECONNECT_BACKOFF.jitter is Jitter.SPREAD  # d * (0.5 + r)
    assert {p.jitter for p in (START_WEIGHTS_BACKOFF, TOKENIZER_FETCH_BACKOFF, PUBLISH_RETRY_BACKOFF)} == {
        Jitter.NONE
    }
    assert {p.jitter for p in (TRAINER_REDIS_BACKOFF, CRASH_BACKOFF, RESPAWN_BACKOFF)} == {Jitter.NONE}
