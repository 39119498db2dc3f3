"""Inserting the rows of an append: ``bulk_create`` without its per-call machinery (a query
object, its compiler, the statement composed anew), about half of its time for a one-row
INSERT on SQLite and a third on PostgreSQL. The statement is composed once per vendor;
values are prepared as ``bulk_create`` prepares them, and the primary keys come back with
RETURNING in the order of the rows, as ``bulk_create`` relies on too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model


@dataclass(frozen=True)
class _Statement:
    fields: list[Field[Any, Any]]  # every concrete field but the automatic primary key
    head: str  # INSERT INTO table (columns) VALUES
    row: str  # (%s, %s, …)
    tail: str  # RETURNING pk


_STATEMENTS: dict[tuple[str, str], _Statement] = {}


def rows_insert(rows: Sequence[Model], *, db: str) -> None:
    """What ``bulk_create(rows)`` does, for new rows of one model with an auto primary key."""
    if not rows:
        return
    model = type(rows[0])
    connection = connections[db]
    statement = _statement(model, connection)
    fields = statement.fields
    size = max(connection.ops.bulk_batch_size(fields, rows), 1)
    with connection.cursor() as cursor:
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            values = ", ".join([statement.row] * len(batch))
            params = [value for row in batch for value in row_values(row, fields, connection)]
            cursor.execute(f"{statement.head} {values} {statement.tail}", params)
            for row, (pk,) in zip(batch, cursor.fetchall(), strict=True):
                row.pk = pk
                row._state.adding = False
                row._state.db = db


def insert_fields(model: type[Model]) -> list[Field[Any, Any]]:
    """Every concrete field but the automatic primary key, in the model's order."""
    meta = model._meta
    assert meta.auto_field is not None, f"{meta.label} has no automatic primary key"
    return [field for field in meta.concrete_fields if field is not meta.auto_field]


def row_values(
    row: Model, fields: Sequence[Field[Any, Any]], connection: BaseDatabaseWrapper
) -> list[Any]:
    """The values of ``row``, a new instance, for ``fields``, prepared as ``bulk_create``
    prepares them (``pre_save`` sets an ``auto_now_add`` date on the instance too)."""
    return [_prep_save(field, field.pre_save(row, True), connection) for field in fields]


def _prep_save(field: Field[Any, Any], value: Any, connection: BaseDatabaseWrapper) -> Any:
    # Django's fields prepare None as None; a message row leaves several columns NULL, and
    # going through the field costs about 2 µs each (a datetime's checks, for one).
    return None if value is None else field.get_db_prep_save(value, connection)


def _statement(model: type[Model], connection: BaseDatabaseWrapper) -> _Statement:
    key = (model._meta.label, connection.vendor)
    statement = _STATEMENTS.get(key)
    if statement is None:
        meta, quote = model._meta, connection.ops.quote_name
        fields = insert_fields(model)
        assert meta.auto_field is not None  # insert_fields checked it: for the type checker
        columns = ", ".join(quote(column_name(field)) for field in fields)
        statement = _STATEMENTS[key] = _Statement(
            fields=fields,
            head=f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES",
            row=f"({', '.join(['%s'] * len(fields))})",
            tail=f"RETURNING {quote(column_name(meta.auto_field))}",
        )
    return statement


def column_name(field: Field[Any, Any]) -> str:
    """The column of a concrete field."""
    assert field.column is not None  # set on every concrete field of a ready model
    return field.column
