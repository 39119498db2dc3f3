"""Whether ctxsum's tables are there: the migrations of its apps not applied yet to a
database. Read on demand (a query and the migration files), never at import or on a
request that works: by the API's error path, which then answers 503
``migrations_unapplied``. (No system check: ``migrate`` runs the database checks before it
applies anything, and would warn of what it is about to do; ``runserver`` already names
unapplied migrations.)"""

from __future__ import annotations

from django.apps import apps
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor


def ctxsum_apps() -> set[str]:
    """The app labels of ctxsum and its optional apps that are installed."""
    return {config.label for config in apps.get_app_configs() if config.name.startswith("ctxsum")}


def unapplied_migrations(using: str) -> list[str]:
    """``app.migration`` for each migration of ctxsum's installed apps not applied to the
    database ``using``, in the order ``migrate`` would apply them; empty when the state
    cannot be read (a database that is down says so itself)."""
    labels = ctxsum_apps()
    try:
        executor = MigrationExecutor(connections[using])
        targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] in labels]
        plan = executor.migration_plan(targets)
    except DatabaseError:
        return []
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]
