from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class FactsConfig(AppConfig):
    name = "ctxsum.facts"
    label = "ctxsum_facts"
    verbose_name = _("Key facts")
    default_auto_field = "django.db.models.BigAutoField"
    # The facts' REST routes, joined to the core's (ctxsum.api.urls).
    ctxsum_api_urls = "ctxsum.facts.api.urls"

    def ready(self) -> None:
        """Join the core: the facts block of every context, the facts its summarizer
        proposes (asked for and parsed only with the app), merged in its commits, a
        fact that is gone as the API's 404, a conversation's facts counted when it is
        deleted. (The review pages' panels join from ``ctxsum.facts.admin``.)"""
        from ctxsum.api.exceptions import map_app_errors
        from ctxsum.facts.api.errors import fact_errors
        from ctxsum.facts.block import FACTS_BLOCK, facts_block
        from ctxsum.facts.hooks import FactsHook
        from ctxsum.facts.models import Fact
        from ctxsum.hooks import (
            contribute_block,
            deleted_with_conversation,
            register_commit_hook,
            take_summary_facts,
        )

        contribute_block(FACTS_BLOCK, facts_block)
        register_commit_hook(FACTS_BLOCK, FactsHook())
        take_summary_facts(self.label)
        map_app_errors(self.label, fact_errors)
        deleted_with_conversation(self.label, Fact)
