"""System checks for the CTXSUM settings: contradictions are errors, found at start-up."""

from __future__ import annotations

from typing import Any, TypeGuard

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.utils.module_loading import import_string

from ctxsum import policy
from ctxsum.conf import APP_PREFIXES, DEFAULTS, ctxsum_settings

POSITIVE_KEYS = (
    "SUMMARY_TIMEOUT",
    "SUMMARY_MAX_TOKENS",
    "SUMMARY_INPUT_BUDGET",
    "MAX_MESSAGE_BYTES",
    "MAX_BATCH_MESSAGES",
    "MAX_BODY_BYTES",
    "IDEMPOTENCY_KEY_SECONDS",
    "IDEMPOTENCY_CLAIM_SECONDS",
    "FACTS_TRIGGER_SHARE",
)
# Positive numbers, or None for "derived" / "none".
OPTIONAL_POSITIVE_KEYS = ("LEASE_SECONDS", "MAX_CONTEXT_TOKENS")


def _policy_errors() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    parsed: dict[str, Any] = {}
    for key, parse, check_id in (
        ("TRIGGER", policy.parse_trigger, "ctxsum.E002"),
        ("KEEP", policy.parse_keep, "ctxsum.E003"),
    ):
        try:
            parsed[key] = parse(getattr(ctxsum_settings, key))
        except policy.PolicyError as error:
            errors.append(
                Error(
                    f"CTXSUM[{key!r}] is invalid: {error}",
                    hint='Use {"messages": N} and/or {"tokens": N} with positive integers; '
                    "KEEP takes exactly one of them.",
                    id=check_id,
                )
            )
    if not errors:
        try:
            policy.Policy(trigger=parsed["TRIGGER"], keep=parsed["KEEP"])
        except policy.PolicyError as error:
            errors.append(
                Error(
                    f"CTXSUM['KEEP'] contradicts CTXSUM['TRIGGER']: {error}",
                    hint="Keep must be strictly below the trigger in the same unit, and a "
                    "message trigger above keep plus the system message, the summary and the "
                    "key facts block, or every compaction would leave the context at its "
                    "trigger.",
                    id="ctxsum.E004",
                )
            )
    return errors


def _positive(key: str) -> bool:
    """Whether ``key``'s value is what POSITIVE_KEYS and OPTIONAL_POSITIVE_KEYS ask for."""
    value = getattr(ctxsum_settings, key)
    return (value is None and key in OPTIONAL_POSITIVE_KEYS) or (is_number(value) and value > 0)


def _invalid_keys() -> set[str]:
    """The keys the checks that read numbers (READS) need valid, and are not."""
    invalid = {key for key in (*POSITIVE_KEYS, *OPTIONAL_POSITIVE_KEYS) if not _positive(key)}
    prompt: object = ctxsum_settings.PROMPT  # as given, maybe not a string
    return invalid | ({"PROMPT"} if not isinstance(prompt, str) else set())


def _number_errors() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for key in (*POSITIVE_KEYS, *OPTIONAL_POSITIVE_KEYS):
        if _positive(key):
            continue
        value = getattr(ctxsum_settings, key)
        optional = key in OPTIONAL_POSITIVE_KEYS
        errors.append(
            Error(
                f"CTXSUM[{key!r}] must be a positive number{' or None' * optional}, not {value!r}.",
                hint=f"The default is {DEFAULTS[key]!r}.",
                id="ctxsum.E005",
            )
        )
    facts: object = ctxsum_settings.FACTS_MAX_TOKENS
    if isinstance(facts, bool) or not isinstance(facts, int) or facts < 0:
        errors.append(
            Error(
                f"CTXSUM['FACTS_MAX_TOKENS'] must be a whole number, 0 or more, not {facts!r}.",
                hint=f"The default is {DEFAULTS['FACTS_MAX_TOKENS']!r}; 0 shows no facts block.",
                id="ctxsum.E005",
            )
        )
    ratio: object = ctxsum_settings.TARGET_RATIO  # as given, maybe not a number
    if not (is_number(ratio) and 0 < ratio < 1):
        errors.append(
            Error(
                f"CTXSUM['TARGET_RATIO'] must be a number between 0 and 1, not {ratio!r}.",
                hint=f"The default is {DEFAULTS['TARGET_RATIO']!r}: half the trigger.",
                id="ctxsum.E009",
            )
        )
    payoff: object = ctxsum_settings.REQUIRE_PAYOFF  # as given, maybe not a bool
    if not isinstance(payoff, bool):
        errors.append(Error("CTXSUM['REQUIRE_PAYOFF'] must be True or False.", id="ctxsum.E009"))
    landing: object = ctxsum_settings.LANDING
    if landing not in policy.LANDINGS:
        errors.append(
            Error(
                f"CTXSUM['LANDING'] must be one of {', '.join(map(repr, policy.LANDINGS))}, "
                f"not {landing!r}.",
                hint=f"The default is {DEFAULTS['LANDING']!r}.",
                id="ctxsum.E009",
            )
        )
    for key in ("PROMPT", "PROMPT_VERSION", "SUMMARY_PREFIX"):
        value = getattr(ctxsum_settings, key)
        if not isinstance(value, str) or not value.strip():
            errors.append(Error(f"CTXSUM[{key!r}] must be a non-blank string.", id="ctxsum.E006"))
    return errors


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, and not a bool (which Python takes for an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _input_budget_errors() -> list[CheckMessage]:
    from ctxsum.services.summaries import MIN_CHUNK_BUDGET, history_room, summary_prompt
    from ctxsum.summarizers import get_summarizer
    from ctxsum.tokens import count_text

    try:  # what the summarizer adds to the prompt for key facts
        facts = get_summarizer().facts_instruction()
    except Exception:  # it cannot be built: E007/E008 say why
        facts = ""
    # The longest length-budget line a prompt can carry: 3/4 of the answer's cap.
    prompt = summary_prompt(ctxsum_settings.SUMMARY_MAX_TOKENS * 3 // 4, facts)
    try:
        room = history_room(prompt, count_text)
    except Exception:  # the encoding cannot be loaded: W001 says so
        return []
    if room >= MIN_CHUNK_BUDGET:
        return []
    return [
        Error(
            f"CTXSUM['SUMMARY_INPUT_BUDGET'] leaves {room} tokens of history per summarizer "
            f"call after the prompt and SUMMARY_MAX_TOKENS; at least {MIN_CHUNK_BUDGET} are "
            "needed, so every compaction would fail.",
            hint="Raise SUMMARY_INPUT_BUDGET or lower SUMMARY_MAX_TOKENS.",
            id="ctxsum.E010",
        )
    ]


# A time that must outlast a summarizer call: its consequence when it does not, and a hint.
SHORTER_THAN_TIMEOUT = {
    "LEASE_SECONDS": (
        "ctxsum.W003",
        "another worker may take over a lease while its summarizer call still runs, wasting "
        "that summary.",
        "Leave LEASE_SECONDS unset (SUMMARY_TIMEOUT + 5) or raise it.",
    ),
    "IDEMPOTENCY_CLAIM_SECONDS": (
        "ctxsum.W004",
        "a retry may run a compaction again while the first request with its Idempotency-Key "
        "still waits for the summarizer.",
        "Make it longer than any request takes (the default is "
        f"{DEFAULTS['IDEMPOTENCY_CLAIM_SECONDS']!r}).",
    ),
}


def _timeout_warnings() -> list[CheckMessage]:
    timeout = ctxsum_settings.SUMMARY_TIMEOUT
    warnings: list[CheckMessage] = []
    for key, (check_id, consequence, hint) in SHORTER_THAN_TIMEOUT.items():
        seconds = getattr(ctxsum_settings, key)
        if seconds is not None and seconds < timeout:
            message = f"CTXSUM[{key!r}] ({seconds}) is shorter than SUMMARY_TIMEOUT ({timeout}): "
            warnings.append(Warning(message + consequence, hint=hint, id=check_id))
    return warnings


def _body_limit_errors() -> list[CheckMessage]:
    upload: object = settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # None turns Django's check off
    limit = ctxsum_settings.MAX_BODY_BYTES
    if isinstance(upload, int) and upload < limit:
        return [
            Error(
                f"DATA_UPLOAD_MAX_MEMORY_SIZE ({upload}) is below CTXSUM['MAX_BODY_BYTES'] "
                f"({limit}): Django refuses request bodies between the two before ctxsum reads "
                "them.",
                hint="Set DATA_UPLOAD_MAX_MEMORY_SIZE to at least MAX_BODY_BYTES (or lower "
                "MAX_BODY_BYTES to it).",
                id="ctxsum.E013",
            )
        ]
    return []


def _runner_errors() -> list[CheckMessage]:
    """AUTO_COMPACT and the COMPACTION_RUNNER that carries it out."""
    from ctxsum.services.autocompact import RUNNERS, SYNC, compaction_enqueuer

    auto: object = ctxsum_settings.AUTO_COMPACT  # as given, maybe not a bool
    if not isinstance(auto, bool):
        return [Error("CTXSUM['AUTO_COMPACT'] must be True or False.", id="ctxsum.E020")]
    runner: object = ctxsum_settings.COMPACTION_RUNNER
    if runner == SYNC:
        return []
    try:
        enqueue: object = compaction_enqueuer()
    except Exception as error:  # not importable, or the task backend refuses the task
        return [
            Error(
                f"CTXSUM['COMPACTION_RUNNER'] ({runner!r}) cannot be loaded: {error}",
                hint=f"Use {', '.join(map(repr, [*RUNNERS, SYNC]))} or the dotted path of a "
                "callable(conversation_id, database); 'celery' needs Celery installed.",
                id="ctxsum.E020",
            )
        ]
    if not callable(enqueue):
        message = f"CTXSUM['COMPACTION_RUNNER'] ({runner!r}) is not callable."
        return [Error(message, id="ctxsum.E020")]
    return _backend_warnings(auto) if runner == "tasks" else []


def _backend_warnings(auto: bool) -> list[CheckMessage]:
    """For the "tasks" runner: W008, a backend whose tasks wait for a worker the project has
    to start, and W006, one that cannot defer a task. The immediate backend is exempt from
    both: it runs the compaction in the appending process; the dummy one, for tests, from
    W008: it never runs a task."""
    from ctxsum.tasks import compact_conversation

    try:
        backend = compact_conversation.get_backend()
    except Exception:  # a TASKS setting the tasks framework's own checks report
        return []
    name = type(backend).__name__
    warnings: list[CheckMessage] = []
    if auto and name not in ("ImmediateBackend", "DummyBackend"):
        worker = "`manage.py db_worker`" if name == "DatabaseBackend" else f"{name}'s worker"
        warnings.append(
            Warning(
                f"The task backend {name} runs compactions only in a worker: until {worker} "
                "runs, they wait, and a context compacts only once it exceeds its ceiling.",
                hint=f"Start {worker} beside the web processes, then silence ctxsum.W008.",
                id="ctxsum.W008",
            )
        )
    if not backend.supports_defer and name != "ImmediateBackend":
        warnings.append(
            Warning(
                f"The task backend {name} cannot defer a task (run_after): a background "
                "compaction lost with its worker (killed mid-call) is not retried.",
                hint="Use django_tasks_db.DatabaseBackend, whose db_worker runs deferred "
                "tasks, or run `manage.py ctxsum_compact --due` on a schedule.",
                id="ctxsum.W006",
            )
        )
    return warnings


def _summarizer_errors(*, build: bool) -> list[CheckMessage]:
    """E007 for a SUMMARIZER that is not a backend; when ``build`` (the numbers it is built
    with are valid), the backend's own checks, or E008 when it cannot be built."""
    from ctxsum.summarizers import Summarizer, get_summarizer

    try:
        backend_class: object = ctxsum_settings.SUMMARIZER  # as given, maybe not a class
    except ImportError as error:
        return [
            Error(
                f"CTXSUM['SUMMARIZER'] cannot be imported: {error}",
                hint="Give the dotted path of a ctxsum.summarizers.Summarizer subclass.",
                id="ctxsum.E007",
            )
        ]
    if not (isinstance(backend_class, type) and issubclass(backend_class, Summarizer)):
        return [
            Error(
                f"CTXSUM['SUMMARIZER'] is {backend_class!r}, not a Summarizer subclass.",
                id="ctxsum.E007",
            )
        ]
    if not build:
        return []
    try:
        return list(get_summarizer().check())
    except Exception as error:  # a backend that cannot even be built is a config error
        return [Error(f"The summarizer cannot be created: {error}", id="ctxsum.E008")]


def _api_access_errors() -> list[CheckMessage]:
    """E015: API_PERMISSION_CLASSES names permission classes, API_CONVERSATIONS a callable."""
    errors: list[CheckMessage] = []
    classes: object = ctxsum_settings.API_PERMISSION_CLASSES
    if not isinstance(classes, list | tuple) or not all(isinstance(p, str) for p in classes):
        message = "CTXSUM['API_PERMISSION_CLASSES'] must be a list of dotted paths."
        errors.append(Error(message, id="ctxsum.E015"))
        classes = []
    for path in classes:
        try:
            found: object = import_string(path)
        except ImportError as error:
            message = f"CTXSUM['API_PERMISSION_CLASSES']: {path!r} cannot be imported: {error}"
            errors.append(Error(message, id="ctxsum.E015"))
            continue
        if not (isinstance(found, type) and hasattr(found, "has_permission")):
            message = f"CTXSUM['API_PERMISSION_CLASSES']: {path!r} is not a permission class."
            hint = "Name subclasses of rest_framework.permissions.BasePermission."
            errors.append(Error(message, hint=hint, id="ctxsum.E015"))
    try:
        reachable: object = ctxsum_settings.API_CONVERSATIONS
    except ImportError as error:
        message = f"CTXSUM['API_CONVERSATIONS'] cannot be imported: {error}"
        errors.append(Error(message, id="ctxsum.E015"))
    else:
        if not callable(reachable):
            message = f"CTXSUM['API_CONVERSATIONS'] ({reachable!r}) is not callable."
            hint = "Give the dotted path of a callable(request) -> QuerySet of Conversation."
            errors.append(Error(message, hint=hint, id="ctxsum.E015"))
    return errors


def _encoding_warnings() -> list[CheckMessage]:
    from ctxsum.tokens import encoding_for

    try:
        encoding_for(None)
    except Exception as error:
        return [
            Warning(
                f"The tiktoken encoding cannot be loaded: {error}",
                hint="tiktoken downloads its encodings on first use. Without a route to the "
                "download, set TIKTOKEN_CACHE_DIR to a folder that holds them.",
                id="ctxsum.W001",
            )
        ]
    return []


def _app_of(key: str) -> str | None:
    """The optional app a key of CTXSUM belongs to by its prefix (CHAT_: ctxsum.chat)."""
    return next((app for prefix, app in APP_PREFIXES.items() if key.startswith(prefix)), None)


def _absent_app_warnings() -> list[CheckMessage]:
    """ctxsum.W007: keys of an optional app that is not installed (so nothing reads them)."""
    return [
        Warning(
            f"CTXSUM[{key!r}] is a setting of {app}, which is not in INSTALLED_APPS: "
            "it is ignored.",
            hint=f"Add {app!r} to INSTALLED_APPS, or remove the setting.",
            id="ctxsum.W007",
        )
        for key in ctxsum_settings.unknown_keys()
        if (app := _app_of(key))
    ]


# The checks that read numbers, each run only when the numbers it reads are valid (else
# E005 already names them, and a check built on them would only repeat it, or fail).
READS = {
    "input_budget": ("SUMMARY_MAX_TOKENS", "SUMMARY_INPUT_BUDGET", "PROMPT"),
    "body_limit": ("MAX_BODY_BYTES",),
    "timeouts": ("SUMMARY_TIMEOUT", "LEASE_SECONDS", "IDEMPOTENCY_CLAIM_SECONDS"),
    "summarizer": ("SUMMARY_TIMEOUT", "SUMMARY_MAX_TOKENS"),
}


@register()
def ctxsum_settings_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The core's settings (an optional app checks its own keys of CTXSUM), every problem
    in one run: one typo does not hide another."""
    errors = _unknown_key_errors() + _absent_app_warnings() + _policy_errors()
    errors += _number_errors()
    invalid = _invalid_keys()

    def valid(check: str) -> bool:
        return not invalid.intersection(READS[check])

    errors += _input_budget_errors() if valid("input_budget") else []
    errors += _body_limit_errors() if valid("body_limit") else []
    errors += _timeout_warnings() if valid("timeouts") else []
    errors += _runner_errors() + _summarizer_errors(build=valid("summarizer"))
    return errors + _api_access_errors() + _encoding_warnings()


def _unknown_key_errors() -> list[CheckMessage]:
    unknown = [key for key in ctxsum_settings.unknown_keys() if not _app_of(key)]
    if not unknown:
        return []
    return [
        Error(
            f"Unknown CTXSUM setting(s): {', '.join(unknown)}.",
            hint=f"Known keys: {', '.join(DEFAULTS)}.",
            id="ctxsum.E001",
        )
    ]
