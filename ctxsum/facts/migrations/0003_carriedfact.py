import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ctxsum", "0010_interrupted_reason"),
        ("ctxsum_facts", "0002_adopt_content_types"),
    ]

    operations = [
        migrations.CreateModel(
            name="CarriedFact",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("value", models.TextField()),
                (
                    "conversation",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="ctxsum.conversation",
                    ),
                ),
                (
                    "fact",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="ctxsum_facts.fact",
                    ),
                ),
            ],
            options={
                "db_table": "ctxsum_carriedfact",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("conversation", "fact"), name="ctxsum_carried_uniq"
                    )
                ],
            },
        ),
    ]
