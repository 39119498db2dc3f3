"""The chat turn's rows: each stored turn (ChatTurn), the calls a user reserved per day
(ChatCallDay), and a conversation's turn lock and call count (ChatState). ChatTurn and
ChatCallDay keep the tables they had in the core app, so a database migrated before the
move adopts them. Each declares its app label: a core module that imports them in a
project without the app does not make them models of the core."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from ctxsum.models import Conversation, Message


class ChatState(models.Model):
    """A conversation's chat state: its turn lock (which turn is calling the model, and
    since when: one turn per conversation at a time, abandoned after CHAT_TURN_SECONDS) and
    the model calls reserved so far (CHAT_MAX_CALLS_PER_CONVERSATION; a failed turn gives
    its call back). Created with the conversation, or by its first turn when the app came
    later."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, primary_key=True, related_name="chat_state"
    )
    turn_owner = models.CharField(max_length=64, blank=True, default="")
    turn_started_at = models.DateTimeField(null=True, blank=True)
    chat_calls = models.PositiveIntegerField(default=0)

    class Meta:
        app_label = "ctxsum_chat"
        db_table = "ctxsum_chatstate"

    def __str__(self) -> str:
        return f"{self.conversation_id}: {self.chat_calls} call(s)"


class ChatTurn(models.Model):
    """One successful chat turn: the message it answered, the reply, and what the provider
    reported of the call. Written in the transaction that stores the two messages."""

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="chat_turns"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="ctxsum_chat_turns",
    )
    # The user (or tool) message the turn stored; NULL for a turn that continued after
    # tool results appended before it.
    message = models.OneToOneField(
        Message, null=True, blank=True, on_delete=models.CASCADE, related_name="chat_request"
    )
    reply = models.OneToOneField(Message, on_delete=models.CASCADE, related_name="chat_turn")
    # The model asked for first, and the one that answered (after fallbacks).
    requested_model = models.CharField(max_length=100)
    model = models.CharField(max_length=100)
    # HTTP requests made (retries included) and models given up on before the answer.
    attempts = models.PositiveIntegerField(default=1)
    fallbacks = models.PositiveIntegerField(default=0)
    # Usage as the provider reported it (NULL: not reported).
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    total_tokens = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    streamed = models.BooleanField(default=False)
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "ctxsum_chat"
        db_table = "ctxsum_chatturn"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["conversation", "-created_at"], name="ctxsum_turn_conv")]

    def __str__(self) -> str:
        return f"{self.conversation_id} turn {self.model}"


class ChatCallDay(models.Model):
    """Model calls one user reserved on one UTC day (CHAT_MAX_CALLS_PER_USER_PER_DAY): the row
    a reservation's conditional UPDATE counts on, so two turns cannot both take the last."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ctxsum_chat_days"
    )
    day = models.DateField()
    calls = models.PositiveIntegerField(default=0)

    class Meta:
        app_label = "ctxsum_chat"
        db_table = "ctxsum_chatcallday"
        constraints = [
            models.UniqueConstraint(fields=["user", "day"], name="ctxsum_chat_day_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} {self.day}: {self.calls}"
