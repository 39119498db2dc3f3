"""Key facts over REST: a conversation's (its own and its subject's, with whether its facts
block shows each one) and a subject's. A person's writes go through ``ctxsum.facts.services``."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from ctxsum.api import schema
from ctxsum.api.base import CtxsumView, subject_from_path
from ctxsum.api.idempotency import idempotent
from ctxsum.facts import selectors as fact_selectors
from ctxsum.facts import services
from ctxsum.facts.api.paths import fact_id_from_path
from ctxsum.facts.api.serializers import (
    FactCreateInputSerializer,
    FactInputSerializer,
    FactOutputSerializer,
)
from ctxsum.facts.models import Fact

SCOPE_NOTE = (
    "A conversation sees its own facts and, when it names a `subject`, that subject's: "
    "the facts a person or the summarizer wrote for the caller's conversations naming it. "
    "Where both have a key, the conversation's own is the one its block shows."
)
KEY_NOTE = (
    "`key` (one line, at most 200 characters) and `value` (at most 2000) are stripped and "
    "must not be blank; the key is normalized as the summarizer's are (`Order ID` is "
    "`order_id`), and one the %s has already is a 400 naming `key`."
)
WRITE_NOTE = (
    "A person's write marks the fact `changed_by: person`; the summarizer never overwrites "
    "it again, and proposes a change in `proposed_value` instead. Writing a `value` (the "
    "proposed one to accept it) settles the proposal. Every conversation that shows the "
    "fact has its facts block recounted (`facts_tokens`, `active_tokens`) and its "
    "`revision` moved."
)


def _answer(seen: fact_selectors.FactsSeen, pk: int, **kwargs: Any) -> Response:
    """The fact ``pk`` as ``seen`` by a conversation, with whether its block shows it."""
    fact = seen.get(pk)
    return Response(FactOutputSerializer(fact, context={"shown": seen.shown}).data, **kwargs)


class ConversationFactList(CtxsumView):
    serializer_class = FactCreateInputSerializer

    @schema.operation(
        "facts_list",
        "The facts a conversation sees, its own and its subject's",
        FactOutputSerializer(many=True),
        description=f"{SCOPE_NOTE} Listed pinned first, then the most recently confirmed; "
        "`in_context` says whether the facts block of the context shows the fact now.",
    )
    def get(self, request: Request, pk: str) -> Response:
        seen = fact_selectors.conversation_facts(conversation=self.get_conversation())
        page = self.paginate_queryset(seen.facts)
        data = FactOutputSerializer(page, many=True, context={"shown": seen.shown}).data
        return self.get_paginated_response(data)

    @idempotent
    @schema.operation(
        "facts_create",
        "Add a fact of the conversation's own",
        FactOutputSerializer,
        status=201,
        description=f"{KEY_NOTE % 'conversation'} To share a fact with every conversation of "
        f"a subject, add it to the subject instead. {WRITE_NOTE}",
    )
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        fields = self.validated(FactCreateInputSerializer)
        fact = services.fact_add(user=request.user, conversation=conversation, **fields)
        seen = fact_selectors.conversation_facts(conversation=conversation)
        return _answer(seen, fact.pk, status=status.HTTP_201_CREATED)


class ConversationFactDetail(CtxsumView):
    serializer_class = FactInputSerializer

    def _fact(self, fact_id: str) -> tuple[fact_selectors.FactsSeen, Fact]:
        """The facts the conversation sees, and the one the path names among them."""
        number = fact_id_from_path(fact_id)
        seen = fact_selectors.conversation_facts(conversation=self.get_conversation())
        return seen, seen.get(number)  # a missing fact is a 404 (fact_errors)

    @schema.operation(
        "facts_retrieve",
        "One fact the conversation sees",
        FactOutputSerializer,
    )
    def get(self, request: Request, pk: str, fact_id: str) -> Response:
        seen, fact = self._fact(fact_id)
        return _answer(seen, fact.pk)

    @schema.operation(
        "facts_partial_update",
        "Change a fact's value, key or pin",
        FactOutputSerializer,
        description="Any of `value`, `key` and `pinned`. A subject's fact changes for every "
        f"conversation of the subject. {WRITE_NOTE}",
    )
    def patch(self, request: Request, pk: str, fact_id: str) -> Response:
        _, fact = self._fact(fact_id)
        fields = self.validated(FactInputSerializer)
        services.fact_change(fact=fact, user=request.user, **fields)
        seen = fact_selectors.conversation_facts(conversation=self.get_conversation())
        return _answer(seen, fact.pk)

    @schema.operation(
        "facts_destroy",
        "Delete a fact (a subject's: for every conversation of the subject)",
        None,
        status=204,
    )
    def delete(self, request: Request, pk: str, fact_id: str) -> Response:
        _, fact = self._fact(fact_id)
        services.fact_delete(fact=fact, user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SubjectView(CtxsumView):
    """An endpoint about one of the caller's subjects (no conversation in its path)."""

    def subject(self) -> str:
        return subject_from_path(self.kwargs["subject"])

    def facts(self) -> QuerySet[Fact]:
        return fact_selectors.subject_facts(owner=self.request.user, subject=self.subject())


class SubjectFactList(SubjectView):
    serializer_class = FactCreateInputSerializer

    @schema.operation(
        "subject_facts_list",
        "The caller's facts of a subject",
        FactOutputSerializer(many=True),
        description="Shared by every conversation of the caller that names the subject "
        "(`subject` on the conversation); a subject no fact has yet lists none. "
        "`in_context` is null: whether a block shows a fact depends on the conversation "
        "(see its own list).",
    )
    def get(self, request: Request, subject: str) -> Response:
        return self.page_response(self.facts(), FactOutputSerializer)

    @schema.operation(
        "subject_facts_create",
        "Add a fact to a subject, for every conversation naming it",
        FactOutputSerializer,
        status=201,
        description=f"{KEY_NOTE % 'subject'} A subject's fact may come before any "
        f"conversation names it. {WRITE_NOTE}",
    )
    def post(self, request: Request, subject: str) -> Response:
        name = self.subject()
        fields = self.validated(FactCreateInputSerializer)
        fact = services.fact_add(user=request.user, subject=name, **fields)
        created = self.facts().get(pk=fact.pk)
        return Response(FactOutputSerializer(created).data, status=status.HTTP_201_CREATED)


class SubjectFactDetail(SubjectView):
    serializer_class = FactInputSerializer

    def _fact(self, fact_id: str) -> Fact:
        return self.facts().get(pk=fact_id_from_path(fact_id))  # missing: fact_errors' 404

    @schema.operation(
        "subject_facts_retrieve",
        "One of the caller's facts of a subject",
        FactOutputSerializer,
    )
    def get(self, request: Request, subject: str, fact_id: str) -> Response:
        return Response(FactOutputSerializer(self._fact(fact_id)).data)

    @schema.operation(
        "subject_facts_partial_update",
        "Change a subject's fact: its value, key or pin",
        FactOutputSerializer,
        description=f"Any of `value`, `key` and `pinned`. {WRITE_NOTE}",
    )
    def patch(self, request: Request, subject: str, fact_id: str) -> Response:
        fact = self._fact(fact_id)
        fields = self.validated(FactInputSerializer)
        services.fact_change(fact=fact, user=request.user, **fields)
        return Response(FactOutputSerializer(self._fact(fact_id)).data)

    @schema.operation(
        "subject_facts_destroy",
        "Delete a subject's fact, for every conversation naming the subject",
        None,
        status=204,
    )
    def delete(self, request: Request, subject: str, fact_id: str) -> Response:
        services.fact_delete(fact=self._fact(fact_id), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
