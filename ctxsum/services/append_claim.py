"""An append's claim on its conversation row: one UPDATE that moves the counters, hands out
the batch's ``seq`` numbers and returns the row.

The UPDATE holds the row lock until the transaction ends, as ``SELECT … FOR UPDATE`` did, so
appends, compaction commits, reverts and deletes still serialize on the row; PostgreSQL
computes ``next_seq + n`` on the row as the previous lock holder committed it, so concurrent
appends get consecutive, disjoint ranges. RETURNING brings the row back in the same round
trip (PostgreSQL, and SQLite from 3.35, which ctxsum needs anyway: its inserts read primary
keys back). What the append does next under the lock (the tool-result checks, the INSERT)
runs in the same transaction: a refusal rolls the counters back with it.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.utils import timezone

from ctxsum.models import Conversation

# The counters that move by the number of messages appended.
BY_COUNT = ("next_seq", "message_count", "active_message_count")
# The statement per database vendor (quoting names is the backend's).
_SQL: dict[str, str] = {}
# The converters of the returned columns, per connection (each thread has its own).
_CONVERTERS: WeakKeyDictionary[BaseDatabaseWrapper, list[tuple[int, Any, list[Any]]]] = (
    WeakKeyDictionary()
)


def append_claim(*, pk: Any, db: str, count: int, tokens: int) -> Conversation:
    """Lock the conversation ``pk`` on ``db`` for the rest of the transaction and move its
    counters by an append of ``count`` messages holding ``tokens`` tokens (``revision`` and
    ``updated_at`` move too). Returns the row as it is now: the batch's seqs run from
    ``next_seq - count`` to ``next_seq - 1``. Raises Conversation.DoesNotExist when the
    conversation does not exist (or was deleted meanwhile). Call inside a transaction."""
    connection = connections[db]
    meta = Conversation._meta
    now = meta.get_field("updated_at").get_db_prep_value(timezone.now(), connection)
    params = [*([count] * len(BY_COUNT)), tokens, now, meta.pk.get_db_prep_value(pk, connection)]
    with connection.cursor() as cursor:
        cursor.execute(_sql(connection), params)
        row = cursor.fetchone()
    if row is None:
        raise Conversation.DoesNotExist("Conversation matching query does not exist.")
    return _conversation(row, db, connection)


def _sql(connection: BaseDatabaseWrapper) -> str:
    sql = _SQL.get(connection.vendor)
    if sql is None:
        quote, meta = connection.ops.quote_name, Conversation._meta
        moves = [f"{quote(name)} = {quote(name)} + %s" for name in (*BY_COUNT, "active_tokens")]
        moves += [f"{quote('revision')} = {quote('revision')} + 1", f"{quote('updated_at')} = %s"]
        columns = ", ".join(quote(_column(field)) for field in meta.concrete_fields)
        sql = _SQL[connection.vendor] = (
            f"UPDATE {quote(meta.db_table)} SET {', '.join(moves)} "
            f"WHERE {quote(_column(meta.pk))} = %s RETURNING {columns}"
        )
    return sql


def _conversation(row: Any, db: str, connection: BaseDatabaseWrapper) -> Conversation:
    """The returned columns as a Conversation, each value converted as a query would (UUIDs
    and datetimes on SQLite, JSON everywhere)."""
    values = list(row)
    for index, column, converters in _converters(connection):
        value = values[index]
        if value is not None:
            for convert in converters:
                value = convert(value, column, connection)
            values[index] = value
    return Conversation.from_db(db, [], values)  # every field: the names are not needed


def _converters(connection: BaseDatabaseWrapper) -> list[tuple[int, Any, list[Any]]]:
    """For each returned column that needs them, the converters the backend and the field
    apply, as a query's compiler finds them; kept per connection."""
    found = _CONVERTERS.get(connection)
    if found is None:
        found = []
        table = Conversation._meta.db_table
        for index, field in enumerate(Conversation._meta.concrete_fields):
            column = field.get_col(table)
            converters = connection.ops.get_db_converters(column)
            converters += column.get_db_converters(connection)
            if converters:
                found.append((index, column, converters))
        _CONVERTERS[connection] = found
    return found


def _column(field: Field[Any, Any]) -> str:
    assert field.column is not None  # set on every concrete field of a ready model
    return field.column
