"""A database migrated before the key facts became an app of their own holds the content
types of Fact and FactChange under the core's label, "ctxsum", and with them the
permissions granted on facts and the admin's log of them: they move to this app's label. A
new database has none to move."""

from typing import Any

from django.db import migrations

MODELS = ("fact", "factchange")


def relabel(apps: Any, schema_editor: Any, *, old: str, new: str) -> None:
    try:
        content_type = apps.get_model("contenttypes", "ContentType")
    except LookupError:  # django.contrib.contenttypes is not installed
        return
    types = content_type.objects.using(schema_editor.connection.alias)
    for model in MODELS:
        if not types.filter(app_label=new, model=model).exists():
            types.filter(app_label=old, model=model).update(app_label=new)


def adopt(apps: Any, schema_editor: Any) -> None:
    relabel(apps, schema_editor, old="ctxsum", new="ctxsum_facts")


def give_back(apps: Any, schema_editor: Any) -> None:
    relabel(apps, schema_editor, old="ctxsum_facts", new="ctxsum")


class Migration(migrations.Migration):
    dependencies = [
        ("ctxsum_facts", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(adopt, give_back),
    ]
