"""An append's claim on its conversation row: one UPDATE that moves the counters, hands out
the batch's ``seq`` numbers and returns the row (RETURNING, in the same round trip).

The UPDATE holds the row lock until the transaction ends, as ``SELECT … FOR UPDATE`` would,
and computes ``next_seq + n`` on the row as the previous holder committed it, so concurrent
appends get disjoint ranges. On PostgreSQL, an append with nothing to check under the lock
is one statement (``append_claim_insert``): the UPDATE in a ``WITH`` clause, the INSERT
taking its seqs from the row it returned, and the tool-call index rows; one round trip
instead of four, with the values the transaction's INSERT would store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.utils import timezone

from ctxsum.models import Conversation, Message, ToolCall
from ctxsum.services.inserts import column_name, insert_fields, row_values

# The counters that move by the number of messages appended.
BY_COUNT = ("next_seq", "message_count", "active_message_count")
# The row the claim returns: every field, in the model's order, which ``from_db`` takes.
RETURNED = Conversation._meta.concrete_fields
# The statement per database vendor (quoting names is the backend's).
_SQL: dict[str, str] = {}
# The query compiler's converters of the returned columns, by index, per connection (each
# thread has its own): the returned values become field values as a query's would.
_CONVERTERS: WeakKeyDictionary[BaseDatabaseWrapper, list[tuple[int, Any]]] = WeakKeyDictionary()


def append_claim(*, pk: Any, db: str, count: int, tokens: int) -> Conversation:
    """Lock the conversation ``pk`` for the rest of the transaction and move its counters by
    an append of ``count`` messages of ``tokens`` tokens; the row as it is now (the batch's
    seqs end at ``next_seq - 1``). Raises Conversation.DoesNotExist when it is gone."""
    connection = connections[db]
    with connection.cursor() as cursor:
        cursor.execute(_sql(connection), _claim_params(pk, count, tokens, connection))
        row = cursor.fetchone()
    if row is None:
        raise _gone()
    return _conversation(row, db, connection)


def append_claim_insert(*, pk: Any, db: str, rows: Sequence[Message], tokens: int) -> Conversation:
    """PostgreSQL: ``append_claim`` and the INSERT of ``rows`` and their tool calls' index
    rows in one statement; the rows get their seqs and primary keys. Raises
    Conversation.DoesNotExist, with nothing inserted, when the conversation is gone."""
    connection = connections[db]
    statement = _claim_insert(connection)
    params = _claim_params(pk, len(rows), tokens, connection)
    calls: list[Any] = []
    for back, row in zip(range(len(rows), 0, -1), rows, strict=True):
        params += [back, *row_values(row, statement.fields, connection)]
        for call in row.tool_calls or ():
            calls += [back, call["id"], call["function"]["name"]]
    sql = [statement.head, ", ".join([statement.row] * len(rows)), statement.added]
    if calls:
        sql += [statement.calls, ", ".join(["(%s, %s, %s)"] * (len(calls) // 3)), statement.joined]
    with connection.cursor() as cursor:
        cursor.execute(" ".join([*sql, statement.tail]), params + calls)
        found = cursor.fetchone()
    if found is None:
        raise _gone()
    locked = _conversation(found[:-1], db, connection)
    numbered = enumerate(zip(rows, found[-1], strict=True), start=locked.next_seq - len(rows))
    for seq, (row, row_pk) in numbered:
        row.seq = seq
        row.pk = row_pk
        row._state.adding = False
        row._state.db = db
    return locked


def _claim_params(pk: Any, count: int, tokens: int, connection: BaseDatabaseWrapper) -> list[Any]:
    """The claim's parameters, in the order of ``_sql``'s placeholders."""
    meta = Conversation._meta
    now = meta.get_field("updated_at").get_db_prep_value(timezone.now(), connection)
    return [*([count] * len(BY_COUNT)), tokens, now, meta.pk.get_db_prep_value(pk, connection)]


def _gone() -> Conversation.DoesNotExist:
    return Conversation.DoesNotExist("Conversation matching query does not exist.")


@dataclass(frozen=True)
class _ClaimInsert:
    """``append_claim_insert``'s statement, but for its VALUES rows, and what they carry."""

    fields: list[Field[Any, Any]]  # the message columns of a VALUES row: all but ``seq``
    head: str  # WITH claim AS (UPDATE … RETURNING …), added AS (INSERT … FROM claim, (VALUES
    row: str  # (CAST(%s AS integer), CAST(%s AS …), …)
    added: str  # ) AS v (…) RETURNING id, seq)
    calls: str  # , calls AS (INSERT INTO the tool-call index … FROM claim, added, (VALUES
    joined: str  # ) AS c (back, call_id, name) WHERE added.seq = claim.next_seq - c.back)
    tail: str  # SELECT claim.* (the returned columns), ARRAY(ids of added) FROM claim


_CLAIM_INSERTS: dict[str, _ClaimInsert] = {}


def _claim_insert(connection: BaseDatabaseWrapper) -> _ClaimInsert:
    """The statement of ``append_claim_insert``, composed once per vendor. Each VALUES row
    is the row's distance back from the claimed ``next_seq`` (its ``seq`` is that less the
    distance), then its values cast to their columns' types (a NULL in VALUES would be
    text). The FROM joins the claim: a conversation that is gone gets no rows."""
    statement = _CLAIM_INSERTS.get(connection.vendor)
    if statement is None:
        quote = connection.ops.quote_name
        fields = [field for field in insert_fields(Message) if field.name != "seq"]
        names = [f"v{index}" for index in range(len(fields))]
        casts = [f"CAST(%s AS {_values_type(field, connection)})" for field in fields]
        seq = quote(column_name(Message._meta.get_field("seq")))
        pk = quote(column_name(Message._meta.pk))
        columns = ", ".join([*(quote(column_name(field)) for field in fields), seq])
        values = ", ".join(f"v.{name}" for name in names)
        index = {field.name: field for field in ToolCall._meta.concrete_fields}
        index_columns = ", ".join(
            quote(column_name(index[field]))
            for field in ("conversation", "message", "seq", "call_id", "name")
        )
        next_seq = f"claim.{quote('next_seq')}"
        statement = _CLAIM_INSERTS[connection.vendor] = _ClaimInsert(
            fields=fields,
            head=(
                f"WITH claim AS ({_sql(connection)}), "
                f"added AS (INSERT INTO {quote(Message._meta.db_table)} ({columns}) "
                f"SELECT {values}, {next_seq} - v.back FROM claim, (VALUES"
            ),
            row=f"(CAST(%s AS integer), {', '.join(casts)})",
            added=f") AS v (back, {', '.join(names)}) RETURNING {pk}, {seq})",
            calls=(
                f", calls AS (INSERT INTO {quote(ToolCall._meta.db_table)} ({index_columns}) "
                f"SELECT claim.{quote(column_name(Conversation._meta.pk))}, added.{pk}, "
                f"added.{seq}, c.call_id, c.name FROM claim, added, (VALUES"
            ),
            joined=f") AS c (back, call_id, name) WHERE added.{seq} = {next_seq} - c.back)",
            tail=f"SELECT claim.*, ARRAY(SELECT {pk} FROM added ORDER BY {seq}) FROM claim",
        )
    return statement


def _values_type(field: Field[Any, Any], connection: BaseDatabaseWrapper) -> str:
    """The field's type, but ``text`` for a ``varchar(n)``: a cast would cut a longer value
    that the INSERT must refuse."""
    db_type = field.cast_db_type(connection) or "text"
    return "text" if db_type.startswith("varchar") else db_type


def _sql(connection: BaseDatabaseWrapper) -> str:
    sql = _SQL.get(connection.vendor)
    if sql is None:
        quote, meta = connection.ops.quote_name, Conversation._meta
        moves = [f"{quote(name)} = {quote(name)} + %s" for name in (*BY_COUNT, "active_tokens")]
        moves += [f"{quote('revision')} = {quote('revision')} + 1", f"{quote('updated_at')} = %s"]
        columns = ", ".join(quote(column_name(field)) for field in RETURNED)
        sql = _SQL[connection.vendor] = (
            f"UPDATE {quote(meta.db_table)} SET {', '.join(moves)} "
            f"WHERE {quote(column_name(meta.pk))} = %s RETURNING {columns}"
        )
    return sql


def _conversation(row: Any, db: str, connection: BaseDatabaseWrapper) -> Conversation:
    """The returned columns as a Conversation, each value but None (which every converter
    keeps) converted by the query compiler's converters (UUIDs, datetimes, JSON)."""
    found = _CONVERTERS.get(connection)
    if found is None:
        compiler = Conversation.objects.all().query.get_compiler(connection=connection)
        table = Conversation._meta.db_table
        converters = compiler.get_converters([field.get_col(table) for field in RETURNED])
        found = _CONVERTERS[connection] = list(converters.items())
    values = list(row)
    for index, (converters, column) in found:
        if values[index] is not None:
            for convert in converters:
                values[index] = convert(values[index], column, connection)
    return Conversation.from_db(db, [], values)  # every field: the names are not needed
