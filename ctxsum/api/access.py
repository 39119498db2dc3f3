"""Who may use the REST API, and which conversations a request can reach: two settings,
``API_PERMISSION_CLASSES`` and ``API_CONVERSATIONS``, so that a project changes them
without copying the views (docs/how-to/permissions.md has examples)."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from ctxsum import selectors
from ctxsum.conf import ctxsum_settings

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from rest_framework.permissions import BasePermission
    from rest_framework.request import Request

    from ctxsum.models import Conversation


def owned_conversations(request: Request) -> QuerySet[Conversation]:
    """``API_CONVERSATIONS``' default: the conversations the request's user owns."""
    return selectors.conversation_list(owner=request.user)


def conversations(request: Request) -> QuerySet[Conversation]:
    """The conversations ``request`` can reach: the list, and every endpoint about one
    conversation (any other id answers 404, like one that does not exist)."""
    reachable: QuerySet[Conversation] = ctxsum_settings.API_CONVERSATIONS(request)
    return reachable if reachable.ordered else selectors.newest_first(reachable)


def permissions() -> list[BasePermission]:
    """An instance of each of ``API_PERMISSION_CLASSES``, for one request."""
    return [permission() for permission in permission_classes()]


def permission_classes() -> list[type[BasePermission]]:
    """The classes ``API_PERMISSION_CLASSES`` names."""
    return [_imported(path) for path in ctxsum_settings.API_PERMISSION_CLASSES]


@cache
def _imported(path: str) -> Any:
    return import_string(path)
