"""REST endpoints: parse the request, call one service or selector, shape the answer.
The chat turn is the ``ctxsum.chat`` app's, the base view in ``ctxsum.api.base``."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.serializers import Serializer

from ctxsum import selectors, services
from ctxsum.api import schema
from ctxsum.api.base import (
    MESSAGE_NOT_FOUND,
    SUMMARY_NOT_FOUND,
    CtxsumView,
    seq_from_path,
    version_from_path,
)
from ctxsum.api.exceptions import coded_messages
from ctxsum.api.idempotency import idempotent
from ctxsum.api.pagination import SummaryPagination, TranscriptPagination
from ctxsum.api.serializers import (
    POLICY_KEYS,
    ApiRootOutputSerializer,
    AppendOutputSerializer,
    CompactInputSerializer,
    CompactionOutputSerializer,
    ContextOutputSerializer,
    ConversationCreateInputSerializer,
    ConversationDetailOutputSerializer,
    ConversationInputSerializer,
    ConversationOutputSerializer,
    EmptyInputSerializer,
    MessageBatchInputSerializer,
    MessageOutputSerializer,
    RebuildOutputSerializer,
    RevertOutputSerializer,
    SummaryOutputSerializer,
    read_after_write,
)
from ctxsum.exceptions import MessagesInvalid
from ctxsum.models import Conversation, Message, Summary


def _nest_policy_errors(error: DjangoValidationError) -> exceptions.ValidationError:
    """The service names ``trigger``/``keep``/…; over REST they live under ``policy``."""
    errors: dict[str, Any] = coded_messages(error)
    nested = {key: errors.pop(key) for key in POLICY_KEYS if key in errors}
    if nested:
        errors["policy"] = nested
    return exceptions.ValidationError(errors)


def _service_fields(validated: dict[str, Any]) -> dict[str, Any]:
    """The validated input as the service's keyword arguments: the policy's keys flattened;
    ``"policy": null`` resets all of them to the settings' defaults."""
    fields = dict(validated)
    if "policy" in fields:
        policy = fields.pop("policy")
        fields.update(dict.fromkeys(POLICY_KEYS) if policy is None else policy)
    return fields


def _with_context(
    output: type[Serializer[Any]], result: Any, conversation: Conversation
) -> Response:
    """``result`` shaped by ``output``, with the context after the write that committed; a
    context that cannot be read is logged and null, and the answer still a success."""
    read = partial(selectors.context_get, conversation=conversation)
    active = read_after_write("the context", conversation.pk, read)
    return Response(output(result, context={"active": active}).data)


def _detail(conversation: Conversation) -> dict[str, Any]:
    active = selectors.context_get(conversation=conversation)
    return ConversationDetailOutputSerializer(conversation, context={"active": active}).data


class ApiRoot(CtxsumView):
    serializer_class = ApiRootOutputSerializer

    @schema.operation("api_root", "Links to the API's collections", ApiRootOutputSerializer)
    def get(self, request: Request) -> Response:
        url = reverse("ctxsum:conversation-list", request=request)
        return Response(ApiRootOutputSerializer({"conversations": url}).data)


class ConversationList(CtxsumView):
    serializer_class = ConversationCreateInputSerializer

    @schema.operation(
        "conversations_list",
        "The caller's conversations, newest first",
        ConversationOutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return self.page_response(self.get_queryset(), ConversationOutputSerializer)

    @schema.operation(
        "conversations_create",
        "Create a conversation, with its system prompt and first messages",
        ConversationDetailOutputSerializer,
        status=201,
    )
    def post(self, request: Request) -> Response:
        fields = _service_fields(self.validated(ConversationCreateInputSerializer))
        try:
            conversation = services.conversation_create(owner=request.user, **fields)
        except MessagesInvalid as error:
            raise exceptions.ValidationError({"messages": error.per_message}) from error
        except DjangoValidationError as error:
            raise _nest_policy_errors(error) from error
        return Response(_detail(conversation), status=status.HTTP_201_CREATED)


class ConversationDetail(CtxsumView):
    serializer_class = ConversationInputSerializer

    @schema.operation(
        "conversations_retrieve",
        "One conversation with its system prompt, active summary and stats",
        ConversationDetailOutputSerializer,
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(_detail(self.get_conversation()))

    @schema.operation(
        "conversations_partial_update",
        "Change the title, metadata, model, policy or system prompt",
        ConversationDetailOutputSerializer,
    )
    def patch(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        fields = _service_fields(self.validated(ConversationInputSerializer, partial=True))
        try:
            services.conversation_update(conversation=conversation, **fields)
        except DjangoValidationError as error:
            raise _nest_policy_errors(error) from error
        return Response(_detail(conversation))

    @schema.operation(
        "conversations_destroy",
        "Delete a conversation with its messages and summaries",
        None,
        status=204,
    )
    def delete(self, request: Request, pk: str) -> Response:
        services.conversation_delete(conversation=self.get_conversation())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MessageList(CtxsumView):
    serializer_class = MessageBatchInputSerializer
    pagination_class = TranscriptPagination

    @schema.operation(
        "messages_list",
        "The transcript: every message in seq order, archived and replaced ones too",
        MessageOutputSerializer(many=True),
    )
    def get(self, request: Request, pk: str) -> Response:
        transcript = selectors.transcript_list(conversation=self.get_conversation())
        return self.page_response(transcript, MessageOutputSerializer)

    @idempotent
    @schema.operation(
        "messages_create",
        "Append one message, or a batch (all or none)",
        AppendOutputSerializer,
        status=201,
        request=schema.MessagesAppend,
        description='The body is one message, or `{"messages": [...]}`. Errors name the '
        'field, and for a batch the message (`{"messages": [{}, {"role": [...]}]}`).',
    )
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        batch = isinstance(request.data, dict) and "messages" in request.data
        if batch:
            messages = self.validated(MessageBatchInputSerializer)["messages"]
        else:
            messages = [request.data]
        try:
            appended = services.message_append(
                conversation=conversation, messages=messages, idempotency=self.idempotency
            )
        except MessagesInvalid as error:
            detail = {"messages": error.per_message} if batch else error.per_message[0]
            raise exceptions.ValidationError(detail) from error
        return Response(AppendOutputSerializer(appended).data, status=status.HTTP_201_CREATED)


class MessageRedact(CtxsumView):
    serializer_class = EmptyInputSerializer

    @schema.operation(
        "messages_redact",
        "Redact a message: its words are erased, its seq stays",
        MessageOutputSerializer,
        description="The content becomes `[redacted]`; a tool call keeps its id and name but "
        "loses its arguments. Tokens and counters are recounted, and every summary version "
        "covering the message is withheld at once (its text a notice, stale); with "
        "AUTO_COMPACT a rebuild follows on the task runner, else `POST …/summaries/rebuild/`. "
        "Redacting a message again changes nothing.",
    )
    def post(self, request: Request, pk: str, seq: str) -> Response:
        conversation = self.get_conversation()
        self.validated(EmptyInputSerializer)
        try:
            message = services.message_redact(conversation=conversation, seq=seq_from_path(seq))
        except Message.DoesNotExist as error:
            raise exceptions.NotFound(MESSAGE_NOT_FOUND) from error
        return Response(MessageOutputSerializer(message).data)


class ContextDetail(CtxsumView):
    serializer_class = ContextOutputSerializer

    @schema.operation(
        "context_retrieve",
        "The active context, as it would be sent to a model now",
        ContextOutputSerializer,
    )
    def get(self, request: Request, pk: str) -> Response:
        context = selectors.context_get(conversation=self.get_conversation())
        return Response(ContextOutputSerializer(context).data)


class ConversationCompact(CtxsumView):
    serializer_class = CompactInputSerializer

    @idempotent
    @schema.operation(
        "conversations_compact",
        "Compact now: summarize what the policy archives",
        CompactionOutputSerializer,
        errors_too=[502],
    )
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        options = self.validated(CompactInputSerializer)
        # A SummarizerError is a 502 (api_exception): the provider's own words are in the
        # attempt record and the log, not in the answer.
        result = services.conversation_compact(conversation=conversation, **options)
        return Response(CompactionOutputSerializer(result).data)


class SummaryRebuild(CtxsumView):
    serializer_class = EmptyInputSerializer

    @idempotent
    @schema.operation(
        "summaries_rebuild",
        "Write the active summary anew from the archived messages, under the current prompt",
        RebuildOutputSerializer,
        errors_too=[502],
        description="For a stale summary (written under another prompt, or covering a "
        "redacted message). The new version covers the same messages; the one it replaces "
        "is kept, marked superseded. `rebuilt: false` comes with a `reason`: "
        "`nothing_to_summarize` (no summary), `in_progress`, `conflict` or `no_gain` (the new "
        "summary was not smaller than the messages it stands for). `context` is "
        "null when it could not be read after the rebuild (which stands).",
    )
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        self.validated(EmptyInputSerializer)
        rebuilt = services.conversation_rebuild(conversation=conversation)
        return _with_context(RebuildOutputSerializer, rebuilt, conversation)


class SummaryRevert(CtxsumView):
    serializer_class = EmptyInputSerializer

    @idempotent
    @schema.operation(
        "summaries_revert",
        "Undo a compaction: the active summary's archived messages become active again",
        RevertOutputSerializer,
        description="`version` must be the active summary's (else 400 naming `version`). "
        "The version it extended (or none) becomes active again, the messages it archived "
        "are active again, and the context is what it was before that compaction plus "
        "whatever was appended since. The reverted version stays in the history, marked "
        "`reverted`; reverting a rebuild restores the version it superseded. Reverting "
        "again walks back one more version. `reverted: false` comes with a `reason`: "
        "`in_progress` (another worker holds the compaction lease) or `conflict` (the "
        "active summary changed meanwhile). `context` is null when it could not be read "
        "after the revert (which stands).",
    )
    def post(self, request: Request, pk: str, version: str) -> Response:
        conversation = self.get_conversation()
        number = version_from_path(version)
        self.validated(EmptyInputSerializer)
        try:
            reverted = services.conversation_revert(conversation=conversation, version=number)
        except Summary.DoesNotExist as error:
            raise exceptions.NotFound(SUMMARY_NOT_FOUND) from error
        return _with_context(RevertOutputSerializer, reverted, conversation)


class SummaryList(CtxsumView):
    serializer_class = SummaryOutputSerializer
    pagination_class = SummaryPagination

    @schema.operation(
        "summaries_list",
        "Every summary version, newest first",
        SummaryOutputSerializer(many=True),
    )
    def get(self, request: Request, pk: str) -> Response:
        summaries = selectors.summary_list(conversation=self.get_conversation())
        return self.page_response(summaries, SummaryOutputSerializer)
