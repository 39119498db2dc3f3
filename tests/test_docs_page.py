"""The API docs page (/api/docs/) in a real browser: headless Chromium, driven by selenium
against the live test server, renders Swagger UI with the API's title and operations, and
loads everything it needs from 127.0.0.1.

Chromium starts with a host-resolver rule that makes every host but 127.0.0.1 unresolvable,
so a reference to a CDN fails to load instead of reaching out; and every request the page
makes is read from Chromium's performance log (the DevTools Network events), so such a
reference is also counted, and the test fails on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from django.urls import reverse
from drf_spectacular.generators import SchemaGenerator

from tests.support.browser import LOCAL_HOST, WAIT_SECONDS, chromium, local_url, needs_chromium

# URLs that make no request: the page's own inline data and blobs.
NO_NETWORK = ("data", "blob", "about", "chrome", "devtools")

pytestmark = [
    needs_chromium,
    # The live server answers from another thread: the test database must be committed.
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium(height=2000, log_network=True) as driver:
        yield driver


def docs_url(live_server) -> str:
    return local_url(live_server, reverse("api-docs"))


def requested_urls(driver) -> list[str]:
    """Every URL the browser asked for since the last call (DevTools Network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def external(urls: list[str]) -> list[str]:
    return [
        url
        for url in urls
        if urlsplit(url).scheme not in NO_NETWORK and urlsplit(url).hostname != LOCAL_HOST
    ]


def rendered_operations(driver) -> list[tuple[str, str]]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    wait = WebDriverWait(driver, WAIT_SECONDS)
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".opblock")))
    return [
        (
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").text,
        )
        for block in driver.find_elements(By.CSS_SELECTOR, ".opblock")
    ]


def test_the_docs_page_renders_the_api_from_127_0_0_1_only(browser, live_server):
    from selenium.webdriver.common.by import By

    browser.get(docs_url(live_server))
    operations = rendered_operations(browser)
    title = browser.find_element(By.CSS_SELECTOR, ".info .title").text
    assert title.startswith("ctxsum"), title
    # Every operation of the schema, each rendered once.
    document = SchemaGenerator().get_schema(request=None, public=True)
    described = [(m.upper(), p) for p, item in document["paths"].items() for m in item]
    assert len(operations) == len(described) >= 14, operations
    paths = {path.replace("\u200b", "") for _, path in operations}
    assert "/api/conversations/{id}/messages/" in paths
    assert ("POST", "/api/conversations/{id}/compact/") in {
        (method, path.replace("\u200b", "")) for method, path in operations
    }
    urls = requested_urls(browser)
    # The log saw the page's own loads: the page, Swagger UI's bundle and the schema.
    assert any(url.endswith(reverse("schema")) for url in urls), urls
    assert any("swagger-ui-bundle" in url for url in urls), urls
    assert external(urls) == [], external(urls)


def test_an_external_reference_would_be_counted_and_fail_to_load(browser, live_server):
    """The check above can fail: a CDN script added to the page is seen, and the resolver
    rule keeps it from loading."""
    browser.get(docs_url(live_server))
    rendered_operations(browser)
    requested_urls(browser)  # what the page itself loaded
    loaded = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const script = document.createElement("script");
        script.src = "https://cdn.jsdelivr.net/npm/swagger-ui-dist/swagger-ui-bundle.js";
        script.onload = () => done(true);
        script.onerror = () => done(false);
        document.head.appendChild(script);
        """
    )
    assert loaded is False
    assert external(requested_urls(browser)) == [
        "https://cdn.jsdelivr.net/npm/swagger-ui-dist/swagger-ui-bundle.js"
    ]
