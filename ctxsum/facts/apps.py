from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class FactsConfig(AppConfig):
    name = "ctxsum.facts"
    label = "ctxsum_facts"
    verbose_name = _("Key facts")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Join the core: the facts block of every context, the facts in its commits."""
        from ctxsum.facts.block import FACTS_BLOCK, facts_block
        from ctxsum.facts.hooks import FactsHook
        from ctxsum.hooks import contribute_block, register_commit_hook

        contribute_block(FACTS_BLOCK, facts_block)
        register_commit_hook(FACTS_BLOCK, FactsHook())
