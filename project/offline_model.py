"""A stand-in chat model for the example project when no OpenAI-compatible server is
configured: ``POST /offline-model/v1/chat/completions`` answers like one (plain or streamed),
so the chat page works right after ``make run``, through the real ``openai`` client over
HTTP. Its reply says what it was sent, which is what ctxsum decides: the system prompt, the
summary and the recent messages. Not a model; not for production."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from ctxsum.conf import ctxsum_settings

NOTE = "Offline demo model: set OPENAI_API_KEY or OPENAI_BASE_URL to talk to a real one."


def _reply(messages: list[dict[str, Any]]) -> str:
    last = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    content = last.get("content")
    said = " ".join(content.split()) if isinstance(content, str) else "(no text)"
    said = said if len(said) <= 160 else said[:159] + "…"
    summary = any(
        isinstance(m.get("content"), str)
        and m["content"].startswith(ctxsum_settings.SUMMARY_PREFIX)
        for m in messages
    )
    sent = f"I was sent {len(messages)} messages"
    sent += ", a summary of the older ones among them." if summary else ", all of them verbatim."
    return f'You said: "{said}". {sent} {NOTE}'


def _usage(messages: list[dict[str, Any]], reply: str) -> dict[str, int]:
    prompt = sum(len(str(m.get("content") or "").split()) for m in messages)
    completion = len(reply.split())
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-offline",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _events(model: str, reply: str, usage: dict[str, int] | None) -> Iterator[str]:
    yield f"data: {json.dumps(_chunk(model, {'role': 'assistant', 'content': ''}))}\n\n"
    words = reply.split(" ")
    for index, word in enumerate(words):
        piece = word if index == len(words) - 1 else word + " "
        yield f"data: {json.dumps(_chunk(model, {'content': piece}))}\n\n"
    yield f"data: {json.dumps(_chunk(model, {}, 'stop'))}\n\n"
    if usage is not None:
        yield f"data: {json.dumps({**_chunk(model, {}), 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


@csrf_exempt
@require_POST
def chat_completions(request: HttpRequest) -> HttpResponseBase:
    try:
        body = json.loads(request.body)
        messages = [m for m in body["messages"] if isinstance(m, dict)]
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": {"message": "Not a chat completion request."}}, status=400)
    model, reply = str(body.get("model", "offline")), _reply(messages)
    usage = _usage(messages, reply)
    if body.get("stream"):
        wanted = (body.get("stream_options") or {}).get("include_usage")
        events = _events(model, reply, usage if wanted else None)
        return StreamingHttpResponse(events, content_type="text/event-stream")
    message = {"role": "assistant", "content": reply}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    completion = {
        "id": "chatcmpl-offline",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
    return JsonResponse(completion)
