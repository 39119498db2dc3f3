"""A database migrated before the chat turn became an app of its own holds the content
types of ChatTurn and ChatCallDay under the core's label, "ctxsum", and with them the
permissions granted on them and the admin's log of them: they move to this app's label. A
new database has none to move."""

from typing import Any

from django.db import migrations

MODELS = ("chatturn", "chatcallday")


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
    relabel(apps, schema_editor, old="ctxsum", new="ctxsum_chat")


def give_back(apps: Any, schema_editor: Any) -> None:
    relabel(apps, schema_editor, old="ctxsum_chat", new="ctxsum")


class Migration(migrations.Migration):
    dependencies = [
        ("ctxsum_chat", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(adopt, give_back),
    ]
