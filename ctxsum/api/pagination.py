"""Pages of the API's lists: by number, 50 a page unless ``page_size`` says otherwise. A
transcript is paged by seq range and a summary list by version range, both numbered with no
gaps (docs/architecture.md, invariant (e)): no OFFSET and no COUNT(*), so the last page
costs what the first one does however long the history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property
from rest_framework.pagination import PageNumberPagination

from ctxsum.api import schema


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_paginated_response_schema(self, results: dict[str, Any]) -> dict[str, Any]:
        return schema.page(super().get_paginated_response_schema(results))


if TYPE_CHECKING:
    RowPaginator = Paginator[Any]
else:
    RowPaginator = Paginator  # not subscriptable at run time


class SeqPaginator(RowPaginator):
    """Django's paginator over one conversation's rows numbered with no gaps: messages by
    ``seq`` from 0, oldest first (a subclass: summaries by ``version`` from 1, newest
    first). The count is the newest number's (one index lookup), a page a range of them."""

    number, first, newest_first = "seq", 0, False
    object_list: QuerySet[Any]

    @cached_property
    def count(self) -> int:
        rows = self.object_list.order_by(f"-{self.number}")
        newest = rows.values_list(self.number, flat=True).first()
        return 0 if newest is None else newest + 1 - self.first

    def page(self, number: Any) -> Page[Any]:
        number = self.validate_number(number)
        low = self.first + (number - 1) * self.per_page
        high = low + self.per_page
        if self.newest_first:  # counted down from the newest: the last page may be short
            high = self.first + self.count - (number - 1) * self.per_page
            low = max(high - self.per_page, self.first)
        rows = self.object_list.filter(**{f"{self.number}__gte": low, f"{self.number}__lt": high})
        ordered = rows.order_by(f"{'-' * self.newest_first}{self.number}")
        # The range never holds more than a page; the LIMIT tells the planner so (without
        # it PostgreSQL may guess thousands of rows and scan the whole table).
        return Page(list(ordered[: self.per_page]), number, self)


class VersionPaginator(SeqPaginator):
    number, first, newest_first = "version", 1, True


class TranscriptPagination(Pagination):
    django_paginator_class = SeqPaginator


class SummaryPagination(Pagination):
    django_paginator_class = VersionPaginator
