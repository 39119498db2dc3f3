"""Headless Chromium for the browser tests, driven by selenium: Debian's chromium and
chromium-driver, started offline (every host but 127.0.0.1 fails to resolve, so a page that
reaches for a CDN fails instead of leaving the machine)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
LOCAL_HOST = "127.0.0.1"
WAIT_SECONDS = 60  # generous: CI runs three suites side by side on two cores

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists() or not Path(CHROMEDRIVER).exists(),
    reason="needs Debian's chromium and chromium-driver: apt-get install chromium "
    "chromium-driver",
)


@contextmanager
def chromium(*, width: int = 1280, height: int = 900, log_network: bool = False) -> Iterator[Any]:
    """A headless Chromium; with ``log_network``, DevTools' Network events are logged
    (``driver.get_log("performance")``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    # Selenium Manager must not look for (or download) a browser of its own.
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
        # Any host but 127.0.0.1 fails to resolve: nothing can leave the machine.
        f"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE {LOCAL_HOST}",
        # Chromium's own traffic (updates, sync, field trials) stays off too.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--no-default-browser-check",
    ):
        options.add_argument(argument)
    if log_network:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT_SECONDS)
    try:
        yield driver
    finally:
        driver.quit()


def local_url(live_server: Any, path: str = "") -> str:
    """``path`` on the live server by address: ``localhost`` would be a host of its own to
    the resolver rule."""
    return f"http://{LOCAL_HOST}:{urlsplit(live_server.url).port}{path}"


def log_in(driver: Any, base_url: str, username: str, password: str) -> None:
    """Log in through the admin's login page."""
    from django.urls import reverse
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    driver.get(base_url + reverse("admin:login"))
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    logged_in = expected_conditions.presence_of_element_located((By.ID, "logout-form"))
    WebDriverWait(driver, WAIT_SECONDS).until(logged_in)
