"""The example project under an ASGI server (uvicorn, daphne, gunicorn's uvicorn workers):
``uvicorn project.asgi:application``. The chat endpoint's turns run on the event loop
there, so a streamed answer reaches its client as the model writes it
(docs/how-to/deploy.md)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = get_asgi_application()
