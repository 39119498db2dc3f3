"""bench.scaling on a small mixed table built from the shipped sample: a compacted
conversation sends the same context, and every measured operation makes the same queries,
whatever the history's length; a never compacted one sends its whole history; and the
measurement leaves every conversation as it found it."""

from __future__ import annotations

import pytest
from django.test import Client

from bench.common import FIXED_SUMMARIZER
from bench.scaling_measure import OPERATIONS, Target, measure, ratio
from bench.scaling_state import others_build, sample_pool, target_build
from tests.query_budgets import CONTEXT as CONTEXT_QUERIES
from tests.support.shared import FIXTURE_CONVERSATIONS

pytestmark = pytest.mark.django_db
SIZES = (10, 120)


@pytest.fixture
def pool(settings):
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": FIXED_SUMMARIZER, "ENCODING": "o200k_base"}
    return sample_pool(FIXTURE_CONVERSATIONS)


def test_scaling_on_a_small_mixed_table(pool, django_user_model) -> None:
    owner = django_user_model.objects.create_user(username="owner")
    other = django_user_model.objects.create_user(username="other")
    others = others_build(pool, owner=other, large=300)
    assert others["conversations"] == 1 + len(pool.dialogues)
    targets = [
        Target(
            f"{size} {compacted}",
            size,
            compacted,
            # One batch: each compacted target has one summary, so no previous version.
            target_build(pool, owner=owner, size=size, compacted=compacted, batch=1000),
        )
        for compacted in (True, False)
        for size in SIZES
    ]
    client = Client()
    client.force_login(owner)

    results = measure(
        targets,
        client,
        rounds=2,
        heavy_rounds=1,
        calls=lambda target, operation: 2,
        heavy=lambda target: not target.compacted and target.size == max(SIZES),
        progress=lambda message: None,
    )

    from ctxsum.selectors import context_get

    small, large = (t for t in targets if t.compacted)
    assert large.built.history >= max(SIZES) and large.built.summaries == 1
    assert (
        context_get(conversation=small.built.conversation).messages
        == context_get(conversation=large.built.conversation).messages
    )
    for name in OPERATIONS:
        assert results[small.name][name]["queries"] == results[large.name][name]["queries"]
        assert results[large.name][name]["ms"]["n"] == 4
        assert ratio(results[large.name][name], results[small.name][name])["extra_queries"] == 0
    assert results[small.name]["context"]["queries"] == CONTEXT_QUERIES
    for target in targets:
        conversation = target.built.conversation
        conversation.refresh_from_db()
        counters = {name: getattr(conversation, name) for name in target.built.counters}
        assert counters == target.built.counters  # every append was rewound
        assert conversation.messages.count() == target.built.history
        if not target.compacted:
            sent = context_get(conversation=conversation).messages
            assert len(sent) == target.built.history
