"""The real conversations (see ``shared.DATA_DIR``), read one record at a time."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.support.shared import DATA_DIR, DATA_FILES


def iter_records(
    data_dir: Path = DATA_DIR,
    files: Sequence[str] = DATA_FILES,
    *,
    limit: int | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file name, record)`` for every conversation, file by file in order; ``limit``
    caps the conversations taken from each file. Plain ``.jsonl`` files are read too (a
    test writes a broken record to one)."""
    for name in files:
        path = Path(data_dir) / name
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            taken = 0
            for line in lines:
                if not line.strip():
                    continue
                if limit is not None and taken >= limit:
                    break
                taken += 1
                yield name, json.loads(line)
