from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CtxsumConfig(AppConfig):
    name = "ctxsum"
    verbose_name = _("Context summarization")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ctxsum import checks  # noqa: F401  (registers the system checks)
