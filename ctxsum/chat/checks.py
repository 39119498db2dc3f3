"""System checks of the chat turn's settings (the CHAT_* keys of CTXSUM), registered by
``ChatConfig.ready()``; the core checks the rest of CTXSUM."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from ctxsum.chat.client import OPTIONS
from ctxsum.chat.conf import chat_settings
from ctxsum.checks import is_number
from ctxsum.summarizers.openai import MAX_TOKENS_PARAMS

CHAT_POSITIVE_KEYS = ("CHAT_TIMEOUT", "CHAT_TURN_SECONDS")
CHAT_LIMIT_KEYS = ("CHAT_MAX_CALLS_PER_CONVERSATION", "CHAT_MAX_CALLS_PER_USER_PER_DAY")


@register()
def chat_settings_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The chat turn's settings: ctxsum.E014 for a bad value, W005 for a turn lock shorter
    than one model call."""
    problems: list[str] = []
    for key in CHAT_POSITIVE_KEYS:
        value = getattr(chat_settings, key)
        if not is_number(value) or value <= 0:
            problems.append(f"CTXSUM[{key!r}] must be a positive number, not {value!r}.")
    retries, backoff = chat_settings.CHAT_RETRIES, chat_settings.CHAT_RETRY_BACKOFF
    if type(retries) is not int or retries < 0:
        problems.append(f"CTXSUM['CHAT_RETRIES'] must be an integer >= 0, not {retries!r}.")
    if not is_number(backoff) or backoff < 0:
        problems.append(f"CTXSUM['CHAT_RETRY_BACKOFF'] must be a number >= 0, not {backoff!r}.")
    for key in CHAT_LIMIT_KEYS:
        value = getattr(chat_settings, key)
        if value is not None and (type(value) is not int or value < 1):
            problems.append(f"CTXSUM[{key!r}] must be a positive integer or None, not {value!r}.")
    models: object = chat_settings.CHAT_FALLBACK_MODELS  # as given, maybe not a list
    if not isinstance(models, list | tuple) or not all(
        isinstance(model, str) and model.strip() for model in models
    ):
        problems.append(
            f"CTXSUM['CHAT_FALLBACK_MODELS'] must be a list of model names, not {models!r}."
        )
    problems += _chat_option_problems(chat_settings.CHAT_OPTIONS)
    errors: list[CheckMessage] = [
        Error(problem, hint="See the comments of ctxsum.chat.conf.DEFAULTS.", id="ctxsum.E014")
        for problem in problems
    ]
    if not errors and chat_settings.CHAT_TURN_SECONDS < chat_settings.CHAT_TIMEOUT:
        errors.append(
            Warning(
                "CTXSUM['CHAT_TURN_SECONDS'] is shorter than CHAT_TIMEOUT: another turn may "
                "take a conversation over while its model call still runs, and that turn's "
                "reply is then not stored.",
                hint="Raise CHAT_TURN_SECONDS well above CHAT_TIMEOUT (and the retries).",
                id="ctxsum.W005",
            )
        )
    return errors


def _chat_option_problems(options: object) -> list[str]:
    if not isinstance(options, dict):
        return [f"CTXSUM['CHAT_OPTIONS'] must be a dict, not {options!r}."]
    problems = [
        f"CTXSUM['CHAT_OPTIONS'] has an unknown key {key!r}; known: {', '.join(sorted(OPTIONS))}."
        for key in sorted(set(options) - set(OPTIONS), key=str)
    ]
    for key, kind in OPTIONS.items():
        if options.get(key) is not None and not isinstance(options[key], kind):
            problems.append(f"CTXSUM['CHAT_OPTIONS'][{key!r}] must be a {kind.__name__}.")
    param = options.get("max_tokens_param")
    if isinstance(param, str) and param not in MAX_TOKENS_PARAMS:
        problems.append(
            f"CTXSUM['CHAT_OPTIONS']['max_tokens_param'] must be one of {MAX_TOKENS_PARAMS}."
        )
    return problems
