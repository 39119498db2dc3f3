"""Write docs/reference/rest-api.md from the OpenAPI document the example project serves."""

from __future__ import annotations

from project.page_command import PageCommand
from project.rest_reference import PAGE, generate


class Command(PageCommand):
    help = (
        "Write docs/reference/rest-api.md: the REST API reference, rendered from the OpenAPI "
        "document (drf-spectacular) the example project serves at /api/schema/."
    )
    page = PAGE
    source = "the document says"

    def page_text(self) -> str:
        return generate()
