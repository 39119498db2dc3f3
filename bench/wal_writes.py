"""What PostgreSQL wrote for a stretch of work, read back from its write-ahead log with the
``pg_walinspect`` extension (PostgreSQL 15+, superuser): the bytes of WAL and the table rows
written (inserted, updated or deleted) between two WAL positions taken around the work.

The server may be shared: only the records of this database count (those whose block
references name its OID, and the commit records of the transactions that wrote them), so
other databases' activity in the same stretch of WAL is left out. Full-page images (the
first change to a page after a checkpoint copies the whole 8 kB page) are counted apart, as
they depend on when the last checkpoint ran. Django must be set up on PostgreSQL."""

from __future__ import annotations

import bisect
import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# Heap records that write one row; MULTI_INSERT writes several (its description says how
# many: "N tuples" up to PostgreSQL 15, "ntuples: N" from 16).
ROW_RECORDS = {"INSERT", "UPDATE", "HOT_UPDATE", "DELETE"}
MULTI_INSERT = "MULTI_INSERT"
SLOT_PREFIX = "bench_wal_writes_"
_BLOCK = re.compile(r"rel \d+/(\d+)/(\d+)")
_NTUPLES = re.compile(r"(?:ntuples: (\d+)|(\d+) tuples)")


def lsn(text: str) -> int:
    """A WAL position ``X/Y`` as one integer."""
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def current_lsn() -> str:
    """The server's current WAL insert position (on Django's connection)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select pg_current_wal_insert_lsn()::text")
        (position,) = cursor.fetchone()
    return str(position)


def available() -> bool:
    """Whether the WAL can be read back here: ``pg_walinspect`` created in this database if
    it can be, and a temporary replication slot allowed (``reserved``)."""
    from django.db import connection, transaction
    from django.db.utils import DatabaseError

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("create extension if not exists pg_walinspect")
        with reserved():
            pass
    except DatabaseError:
        return False
    return True


@contextlib.contextmanager
def reserved() -> Iterator[None]:
    """Keep the WAL written during the block until it has been read: a temporary physical
    replication slot that reserves it (a checkpoint, this benchmark's or another's, would
    otherwise remove the segments it no longer needs), dropped after the block, or with the
    session if the process dies."""
    from django.db import connection

    name = f"{SLOT_PREFIX}{os.getpid()}"
    with connection.cursor() as cursor:
        cursor.execute("select pg_create_physical_replication_slot(%s, true, true)", [name])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("select pg_drop_replication_slot(%s)", [name])


@dataclass
class Written:
    """What one stretch of work wrote: WAL bytes (full-page images included, and apart),
    table rows, and both by table (an index's and a TOAST table's records count for the
    table they belong to)."""

    wal_bytes: int = 0
    fpi_bytes: int = 0
    rows: int = 0
    by_table: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, table: str, *, size: int, fpi: int, rows: int) -> None:
        self.wal_bytes += size
        self.fpi_bytes += fpi
        self.rows += rows
        entry = self.by_table.setdefault(table, {"wal_bytes": 0, "rows": 0})
        entry["wal_bytes"] += size
        entry["rows"] += rows

    def merge(self, other: Written) -> None:
        """Add what ``other`` wrote."""
        self.wal_bytes += other.wal_bytes
        self.fpi_bytes += other.fpi_bytes
        self.rows += other.rows
        for table, entry in other.by_table.items():
            mine = self.by_table.setdefault(table, {"wal_bytes": 0, "rows": 0})
            mine["wal_bytes"] += entry["wal_bytes"]
            mine["rows"] += entry["rows"]


@dataclass(frozen=True)
class Relations:
    """This database's OID, and every relation file's table: the table itself, the table an
    index is on, the table a TOAST table (or its index) stores values of. ``toast`` holds
    the files whose rows are TOAST chunks, not table rows."""

    oid: int
    table_of: dict[int, str]
    toast: frozenset[int]


def relations() -> Relations:
    """The relations of this database now (read after the work: new tables included)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select oid from pg_database where datname = current_database()")
        (oid,) = cursor.fetchone()
        cursor.execute(
            "select c.oid, c.relfilenode, c.relname, c.relkind, c.reltoastrelid, "
            "coalesce(i.indrelid, 0) from pg_class c left join pg_index i on i.indexrelid = c.oid"
        )
        rows = cursor.fetchall()
    name = {row[0]: row[2] for row in rows}
    owner = {row[4]: row[0] for row in rows if row[4]}  # TOAST table -> its table
    table_of: dict[int, str] = {}
    toast: set[int] = set()
    for relid, filenode, _, kind, _, indexed in rows:
        base = indexed or relid
        if base in owner:
            toast.add(filenode)
            base = owner[base]
        table_of[filenode] = name.get(base, str(base))
        if kind == "i":
            toast.discard(filenode)
    return Relations(oid=oid, table_of=table_of, toast=frozenset(toast))


def records(start: str, end: str, oid: int) -> list[tuple[Any, ...]]:
    """The WAL records from ``start`` to ``end`` (at most what is flushed) that touch
    database ``oid``, and every commit or abort record: start position, transaction id,
    resource manager, record type, length, full-page image length, description, block
    references."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "select start_lsn::text, xid::text::bigint, resource_manager, record_type, "
            "record_length, fpi_length, description, coalesce(block_ref, '') "
            "from pg_get_wal_records_info(%s::pg_lsn, "
            "least(%s::pg_lsn, pg_current_wal_flush_lsn())) "
            "where resource_manager = 'Transaction' or block_ref like %s",
            [start, end, f"%/{oid}/%"],
        )
        return list(cursor.fetchall())


def row_count(record_type: str, description: str) -> int:
    """Table rows one heap record writes."""
    kind = record_type.removesuffix("+INIT")
    if kind in ROW_RECORDS:
        return 1
    if kind == MULTI_INSERT:
        found = _NTUPLES.search(description)
        return int(found.group(1) or found.group(2)) if found else 0
    return 0


def ours(rows: Iterable[tuple[Any, ...]], rels: Relations) -> list[tuple[int, str, int, int, int]]:
    """This database's records: (position, table, bytes, full-page bytes, rows), the
    commit records of its transactions under the table ``(commit)``."""
    kept: list[tuple[int, str, int, int, int]] = []
    writers: set[int] = set()
    commits: list[tuple[int, int, int]] = []
    for start, xid, manager, kind, size, fpi, description, blocks in rows:
        position = lsn(start)
        if manager == "Transaction":
            commits.append((position, xid, size))
            continue
        found = _BLOCK.search(blocks)
        if found is None or int(found.group(1)) != rels.oid:
            continue
        filenode = int(found.group(2))
        writers.add(xid)
        counted = row_count(kind, description) if manager.startswith("Heap") else 0
        if filenode in rels.toast:
            counted = 0
        table = rels.table_of.get(filenode, "(other)")
        kept.append((position, table, size, fpi, counted))
    for position, xid, size in commits:
        if xid and xid in writers:
            kept.append((position, "(commit)", size, 0, 0))
    return kept


def attribute(windows: Sequence[tuple[str, str]], rels: Relations) -> tuple[list[Written], Written]:
    """What was written within each ``(start, end)`` WAL window (taken around each stretch
    of work, in order), and what was written in this database between them (the untimed
    steps'; anything a stretch of work left to write after it ended would show there too):
    one read of the WAL from the first start to the last end."""
    written = [Written() for _ in windows]
    between = Written()
    if not windows:
        return written, between
    starts = [lsn(start) for start, _ in windows]
    ends = [lsn(end) for _, end in windows]
    for position, table, size, fpi, counted in ours(
        records(windows[0][0], windows[-1][1], rels.oid), rels
    ):
        index = bisect.bisect_right(starts, position) - 1
        inside = index >= 0 and position < ends[index]
        (written[index] if inside else between).add(table, size=size, fpi=fpi, rows=counted)
    return written, between
