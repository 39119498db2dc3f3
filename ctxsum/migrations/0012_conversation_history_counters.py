# The counters a conversation's stats read instead of counting its history, filled for the
# conversations that exist: one UPDATE of every row, each counter a subquery of its rows.

from django.db import migrations, models
from django.db.models import Count, IntegerField, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce


def _total(rows, aggregate):
    """``aggregate`` over ``rows`` of the outer conversation; 0 when it has none."""
    totals = rows.filter(conversation=OuterRef("pk")).order_by().values("conversation")
    subquery = Subquery(totals.annotate(total=aggregate).values("total"))
    return Coalesce(subquery, 0, output_field=IntegerField())


def fill(apps, schema_editor):
    db = schema_editor.connection.alias
    Conversation = apps.get_model("ctxsum", "Conversation")
    Message = apps.get_model("ctxsum", "Message")
    Summary = apps.get_model("ctxsum", "Summary")
    CompactionAttempt = apps.get_model("ctxsum", "CompactionAttempt")
    archived = Message.objects.using(db).filter(summary__isnull=False)
    compacted = CompactionAttempt.objects.using(db).filter(outcome="compacted")
    Conversation.objects.using(db).update(
        archived_message_count=_total(archived, Count("pk")),
        archived_tokens=_total(archived, Sum("token_count")),
        summary_count=_total(Summary.objects.using(db), Count("pk")),
        compaction_count=_total(compacted, Count("pk")),
    )


class Migration(migrations.Migration):

    dependencies = [
        ('ctxsum', '0011_chat_state_moved'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='archived_message_count',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='conversation',
            name='archived_tokens',
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='conversation',
            name='summary_count',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='conversation',
            name='compaction_count',
            field=models.PositiveIntegerField(default=0),
        ),
        # Backwards the fields go away with their values: nothing to undo.
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
