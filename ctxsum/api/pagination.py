"""Pages of the API's lists: by number, 50 a page unless ``page_size`` says otherwise. A
transcript is paged by seq range, its seqs being gapless (docs/architecture.md, invariant
(e)): no OFFSET and no COUNT(*), so its last page costs what its first one does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property
from rest_framework.pagination import PageNumberPagination

from ctxsum.api import schema
from ctxsum.models import Message


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_paginated_response_schema(self, results: dict[str, Any]) -> dict[str, Any]:
        return schema.page(super().get_paginated_response_schema(results))


if TYPE_CHECKING:
    MessagePaginator = Paginator[Message]
else:
    MessagePaginator = Paginator  # not subscriptable at run time


class SeqPaginator(MessagePaginator):
    """Django's paginator over one conversation's messages, by seq range."""

    object_list: QuerySet[Message]

    @cached_property
    def count(self) -> int:
        newest = self.object_list.order_by("-seq").values_list("seq", flat=True).first()
        return 0 if newest is None else newest + 1

    def page(self, number: Any) -> Page[Message]:
        number = self.validate_number(number)
        first = (number - 1) * self.per_page
        rows = self.object_list.filter(seq__gte=first, seq__lt=first + self.per_page)
        return Page(list(rows.order_by("seq")), number, self)


class TranscriptPagination(Pagination):
    django_paginator_class = SeqPaginator
