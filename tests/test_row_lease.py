"""RowLease on a real database: take, renew, release, lock, staleness and LeaseLost, on the
conversation's compaction lease fields (and its turn lock fields, a lease of its own). The
services that use it are covered by their own tests; these pin the primitive."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from ctxsum.chat import turns
from ctxsum.chat.models import ChatState
from ctxsum.chat.turns import TURN
from ctxsum.exceptions import CtxsumError
from ctxsum.models import Conversation
from ctxsum.services import conversation_create, idempotency, leases
from ctxsum.services.row_lease import LeaseLost, RowLease
from tests.postgres import POSTGRES, blocked, start, wait_until

pytestmark = pytest.mark.django_db

STALE_AFTER = 60.0
seconds = {"stale_after": STALE_AFTER}  # read on each use, like a setting
LEASE = RowLease(
    model=Conversation,
    owner="lease_owner",
    since="leased_at",
    stale_after=lambda: seconds["stale_after"],
)


@pytest.fixture(autouse=True)
def _stale_after() -> Any:
    seconds["stale_after"] = STALE_AFTER
    yield
    seconds["stale_after"] = STALE_AFTER


@pytest.fixture
def row(user: Any) -> Conversation:
    return conversation_create(owner=user)


def fresh(row: Conversation) -> Conversation:
    return Conversation.objects.get(pk=row.pk)


def age(row: Conversation, seconds: float) -> None:
    """Move the lease's last renewal ``seconds`` back, as if its holder went quiet."""
    since = fresh(row).leased_at
    assert since is not None
    Conversation.objects.filter(pk=row.pk).update(leased_at=since - timedelta(seconds=seconds))


# --------------------------------------------------------------------------- take


def test_a_free_lease_is_taken_and_a_held_one_is_not(row, django_assert_num_queries):
    now = timezone.now()
    with django_assert_num_queries(1):  # one conditional UPDATE
        token = LEASE.take(row, db="default", now=now)

    assert token and (fresh(row).lease_owner, fresh(row).leased_at) == (token, now)
    with django_assert_num_queries(2):  # the UPDATE, then whether the row is there
        assert LEASE.take(row.pk, db="default") is None
    assert (fresh(row).lease_owner, fresh(row).leased_at) == (token, now)


def chat_state(row: Conversation) -> ChatState:
    return ChatState.objects.get(pk=row.pk)


def test_the_compaction_lease_and_the_turn_lock_are_independent(row):
    lease = LEASE.take(row, db="default")
    turn = TURN.take(row.pk, db="default")

    assert lease and turn and lease != turn
    assert LEASE.release(row, lease, db="default")
    assert chat_state(row).turn_owner == turn


def test_a_take_sets_its_extra_fields_and_honours_its_condition(row):
    calls = F("chat_calls") + 1
    assert TURN.take(row.pk, db="default", where=Q(chat_calls__lt=0), chat_calls=calls) is None
    assert (chat_state(row).turn_owner, chat_state(row).chat_calls) == ("", 0)

    token = TURN.take(row.pk, db="default", where=Q(chat_calls__lt=1), chat_calls=calls)

    assert (chat_state(row).turn_owner, chat_state(row).chat_calls) == (token, 1)


def test_taking_the_lease_of_a_row_that_is_gone_raises_its_does_not_exist(row):
    Conversation.objects.filter(pk=row.pk).delete()

    with pytest.raises(Conversation.DoesNotExist):
        LEASE.take(row, db="default")


def test_a_lease_is_free_once_exactly_stale_after_seconds_old(row):
    LEASE.take(row, db="default")
    since = fresh(row).leased_at
    stale = since + timedelta(seconds=STALE_AFTER)

    assert LEASE.take(row, db="default", now=stale - timedelta(microseconds=1)) is None
    assert LEASE.take(row, db="default", now=stale) is not None


def test_stale_after_is_read_on_each_use(row):
    LEASE.take(row, db="default")
    age(row, 30)
    assert LEASE.take(row, db="default") is None

    seconds["stale_after"] = 10

    assert LEASE.take(row, db="default") is not None


# --------------------------------------------------------------------------- taken over


def test_a_stale_lease_is_taken_over_and_its_former_holder_has_lost_it(row):
    former = LEASE.take(row, db="default")
    age(row, STALE_AFTER + 1)

    taker = LEASE.take(row, db="default")

    assert taker and taker != former and fresh(row).lease_owner == taker
    with pytest.raises(LeaseLost):
        LEASE.renew(row, former, db="default")
    with pytest.raises(LeaseLost), transaction.atomic():
        LEASE.lock(row, former, db="default")
    assert not LEASE.release(row, former, db="default")
    # The former holder changed nothing: the taker holds the lease, and renews it.
    assert fresh(row).lease_owner == taker
    LEASE.renew(row, taker, db="default")
    with transaction.atomic():
        assert LEASE.lock(row, taker, db="default").lease_owner == taker


def test_a_live_lease_is_not_taken_over(row):
    holder = LEASE.take(row, db="default")
    age(row, STALE_AFTER - 5)

    assert LEASE.take(row, db="default") is None
    LEASE.renew(row, holder, db="default")


# --------------------------------------------------------------------------- renew, update


def test_renewing_restarts_the_clock(row, django_assert_num_queries):
    token = LEASE.take(row, db="default")
    age(row, STALE_AFTER + 1)
    before = timezone.now()

    with django_assert_num_queries(1):
        LEASE.renew(row, token, db="default")

    assert fresh(row).lease_owner == token and fresh(row).leased_at >= before
    assert LEASE.take(row, db="default") is None


def test_an_update_writes_only_while_the_lease_is_held(row):
    token = LEASE.take(row, db="default")

    LEASE.update(row, token, db="default", title="held")
    with pytest.raises(LeaseLost):
        LEASE.update(row, "another", db="default", title="not held")

    assert fresh(row).title == "held"
    assert list(LEASE.held(row, token, db="default")) == [row]
    assert not LEASE.held(row, "another", db="default").exists()


# --------------------------------------------------------------------------- release


def test_a_release_frees_the_lease_once_and_only_for_its_holder(row, django_assert_num_queries):
    token = LEASE.take(row, db="default")

    assert not LEASE.release(row, "another", db="default")
    assert fresh(row).lease_owner == token
    with django_assert_num_queries(1):
        assert LEASE.release(row, token, db="default", title="released")

    assert (fresh(row).lease_owner, fresh(row).leased_at, fresh(row).title) == (
        "",
        None,
        "released",
    )
    assert not LEASE.release(row, token, db="default")
    with pytest.raises(LeaseLost):
        LEASE.renew(row, token, db="default")
    assert LEASE.take(row, db="default") is not None  # free for the next one at once


# --------------------------------------------------------------------------- lock


def test_the_lock_returns_the_row_while_the_lease_is_held(row, django_assert_num_queries):
    token = LEASE.take(row, db="default")
    Conversation.objects.filter(pk=row.pk).update(title="changed meanwhile")

    with transaction.atomic(), django_assert_num_queries(1):
        locked = LEASE.lock(row.pk, token, db="default")

    assert isinstance(locked, Conversation) and locked.pk == row.pk
    assert locked.title == "changed meanwhile"  # read under the lock, not the caller's copy


def test_the_lock_tells_a_lost_lease_from_a_row_that_is_gone(row, django_assert_num_queries):
    token = LEASE.take(row, db="default")
    with transaction.atomic(), django_assert_num_queries(2), pytest.raises(LeaseLost):
        LEASE.lock(row, "another", db="default")

    Conversation.objects.filter(pk=row.pk).delete()

    with transaction.atomic(), pytest.raises(Conversation.DoesNotExist):
        LEASE.lock(row, token, db="default")


# --------------------------------------------------------------------------- as read


def test_expires_and_abandoned_read_the_lease_a_row_shows(row):
    assert LEASE.expires(fresh(row)) is None
    # No owner, no lease, whatever time the row shows.
    assert LEASE.expires(Conversation(lease_owner="", leased_at=timezone.now())) is None
    assert not LEASE.abandoned(fresh(row), timezone.now() + timedelta(days=1))
    LEASE.take(row, db="default")
    read = fresh(row)
    expires = read.leased_at + timedelta(seconds=STALE_AFTER)

    assert LEASE.expires(read) == expires
    assert not LEASE.abandoned(read, expires - timedelta(microseconds=1))
    assert LEASE.abandoned(read, expires)
    seconds["stale_after"] = 1
    assert LEASE.expires(read) == read.leased_at + timedelta(seconds=1)


def test_free_matches_the_rows_a_take_would_take(row, user):
    other = conversation_create(owner=user)
    LEASE.take(row, db="default")
    LEASE.take(other, db="default")
    age(other, STALE_AFTER)
    third = conversation_create(owner=user)

    free = Conversation.objects.filter(LEASE.free(timezone.now()))

    assert set(free.values_list("pk", flat=True)) == {other.pk, third.pk}


# --------------------------------------------------------------------------- one exception


def test_the_three_leases_raise_one_lost_exception():
    assert issubclass(LeaseLost, CtxsumError)
    assert leases.LeaseLost is LeaseLost
    # No alias of it: the turn lock and the Idempotency-Key claim raise LeaseLost itself.
    assert not hasattr(turns, "TurnLost") and not hasattr(idempotency, "ClaimLost")


# --------------------------------------------------------------------------- row locks


def postgres(test: Any) -> Any:
    for mark in POSTGRES:
        test = mark(test)
    return test


@postgres
def test_the_lock_holds_the_row_until_the_commit(row):
    token = LEASE.take(row, db="default")
    with transaction.atomic():
        LEASE.lock(row, token, db="default")
        # Another worker's UPDATE of the same row (its title) waits.
        rows = Conversation.objects.filter(pk=row.pk)
        other = start(lambda: rows.update(title="other"))
        assert wait_until(lambda: blocked(other.pid)), "the take did not wait for the lock"
    assert other.outcome() is not None
