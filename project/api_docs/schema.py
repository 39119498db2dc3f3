"""The section on the OpenAPI schema and the docs page, with what the schema holds read
from the schema the project serves."""

from __future__ import annotations

from collections.abc import Callable

from project.api_docs.document import Document, expect

SCHEMA_PATH = "/api/schema/?format=json"


def schema(document: Document) -> None:
    response = document.client.get(SCHEMA_PATH)
    expect(response.status_code == 200, "the schema is served without a token")
    spec = response.json()
    operations = sum(len(methods) for methods in spec["paths"].values())
    expect("ChatMessage" in spec["components"]["schemas"], "the schema names ChatMessage")
    document.text(
        f"""
        ## The schema and the docs page

        Every request and answer above is described in the OpenAPI {spec["openapi"]}
        document the example project serves (drf-spectacular): {len(spec["paths"])} paths,
        {operations} operations, each with its request body, its answers and its errors.

        ```sh
        curl "$API/schema/?format=json"        # the OpenAPI document (YAML without ?format)
        open http://127.0.0.1:8000/api/docs/   # Swagger UI on it, served locally (no CDN)
        ```

        Neither needs a token; Swagger UI's *Authorize* button takes `Token …` for trying
        the operations. The message component (`ChatMessage`) is one schema per role, and
        follows the rules of [What input is refused](#what-input-is-refused) that a schema
        can state: the fields a role may have, the content parts it may send, null content
        only on an assistant message with `tool_calls`, a `refusal` or `audio`, and no other
        field. What only the server can know (a tool result's `tool_call_id` must answer an
        earlier call, a body or batch over its limit, a NUL character) is left to it, and
        answered as the tables above show; each operation lists those answers and the errors'
        `{{"detail", "code"}}` bodies too.
        """
    )


SECTIONS: tuple[Callable[[Document], None], ...] = (schema,)
