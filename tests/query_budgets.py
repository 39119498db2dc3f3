"""Query budgets of the hot paths: the most queries each may take, however long the
conversation, however many facts. A test measures an operation with
``with assert_queries_at_most(BUDGET):`` (the fixture in tests/conftest.py), which fails
when the block takes more; fewer is fine, and lowering a budget then pins the gain.

Each budget is the count the path takes today, spelled out from its statements. Where two
tests measure the same operation they share its budget.
"""

from __future__ import annotations

from django.db import connection

# --- appends (tests/test_queries.py) -----------------------------------------------------

# Appending inside the test's transaction: SAVEPOINT, the UPDATE of the counters that locks
# the conversation row and returns it, INSERT of the messages, RELEASE.
TRANSACTION_APPEND = 4
# On PostgreSQL, messages with no tool result: the UPDATE, the INSERT and the tool calls'
# index rows as one statement, with no transaction of its own.
ONE_STATEMENT = connection.vendor == "postgresql"
APPEND = 1 if ONE_STATEMENT else TRANSACTION_APPEND
# A tool result also looks its request up in the tool-call index; a tool call inserts it.
APPEND_TOOL_RESULT = TRANSACTION_APPEND + 1
APPEND_TOOL_CALL = 1 if ONE_STATEMENT else TRANSACTION_APPEND + 1
# A batch with a tool result is checked under the row lock, its tool calls indexed after.
APPEND_BATCH = TRANSACTION_APPEND + 1

# --- reads (tests/test_queries.py) -------------------------------------------------------

# The active summary, the active messages, the key facts (the facts block).
CONTEXT = 3
# Over REST, the owner-scoped lookup of the conversation comes first.
REST_LOOKUP = 1
REST_APPEND = REST_LOOKUP + APPEND
REST_CONTEXT = REST_LOOKUP + CONTEXT
# Transcript page: the lookup, the paginator's COUNT, the page.
TRANSCRIPT_PAGE = 3
# Detail: the lookup, the context (3), the stats (the core's from the conversation's
# counters and the context's summary; the chat usage).
REST_DETAIL = REST_LOOKUP + CONTEXT + 1

# --- Idempotency-Key (tests/test_queries.py) ---------------------------------------------

# With an Idempotency-Key: the claim's INSERT in a savepoint (SAVEPOINT, INSERT, RELEASE),
# the claim marked applied inside the append's transaction, and the answer stored.
KEYED_APPEND = REST_LOOKUP + TRANSACTION_APPEND + 3 + 1 + 1
# A replay: the lookup, the INSERT the unique constraint refuses (SAVEPOINT, INSERT,
# ROLLBACK TO SAVEPOINT, RELEASE), and the key's row.
KEYED_REPLAY = REST_LOOKUP + 4 + 1

# --- writes that change nothing ----------------------------------------------------------

# conversation_update with nothing new (tests/test_python_api.py): savepoint, locked read,
# release; no write.
UPDATE_UNCHANGED = 3
# fact_change given nothing to change (tests/test_facts_services.py): no query at all.
FACT_UNCHANGED = 0

# --- compaction (tests/test_compaction.py) -----------------------------------------------

# snapshot (conversation, summary, messages, facts): 4; earlier no_gain for the range: 1;
# lease (one conditional update): 1; commit (savepoint, lock, active summary, newest version,
# insert summary, bulk update, counters, attempt, release): 9; the fresh context
# (conversation, summary, messages, facts): 4. No key facts in these messages: merging
# some adds a few statements, however many facts (tests/test_replay.py).
COMPACTION = 19

# --- the chat turn (tests/test_chat.py) --------------------------------------------------

# A turn with nothing to compact: the check of the message against the context (3: the
# summary, the messages, the key facts), the reservation (SAVEPOINT, UPDATE, RELEASE), the
# row as the reservation left it (1: what the turn plans from), the context again (3), and
# the commit (SAVEPOINT, the locked read, the check that nothing sent was redacted since:
# the active summary and the messages' redactions, INSERT of the two messages, UPDATE of
# the counters, INSERT of the turn, UPDATE of the turn lock, RELEASE).
CHAT_TURN = 3 + 3 + 1 + 3 + 9

# --- the admin (tests/test_admin.py, tests/test_admin_facts.py) --------------------------

# The same for a conversation of 20 messages and of 10,000, and however many facts. Every
# page starts with the session and the user (2).
# The list: COUNT of the filtered list, the page (owner joined, counts, tokens saved and the
# last attempt as subqueries), the source filter's choices.
ADMIN_LIST = 5
# Review: the conversation (annotated like a row of the list), the pinned system message,
# the active summary, the newest active messages, a page of the transcript by seq (the
# summaries joined), the latest versions, the latest attempts, the key facts it sees (one
# query however many there are) and which of them its facts block shows (one).
ADMIN_REVIEW = 11
# Summary: the summary (conversation and previous version joined), the next version, a page
# of the messages it covers (the archiving versions joined), the key facts it wrote (one
# query).
ADMIN_SUMMARY = 6
# The facts list: session, user, the page (joined), the filtered count's page check.
ADMIN_FACT_LIST = 4

# --- the facts API (tests/test_facts_api.py) ---------------------------------------------

# The conversation's lookup, the facts block's read (which facts it shows), then the count
# and the page of the facts it sees (the summary's version joined); for one fact of the
# conversation, the lookup, the block's read and the fact.
CONVERSATION_FACTS = 4
# The subject's facts: the paginator's COUNT, then the page.
SUBJECT_FACTS = 2
