"""The built site's search works opened from disk with the network off (``tox -e docs``).

    python scripts/release/check_offline_search.py [SITE]    # default: site

A headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium) opens
``SITE/index.html`` by its ``file://`` URL with every network request failing (DevTools' offline
emulation, every host name unresolvable), types a query into the search box and reads the results:
exit 1 unless results come, naming the pages found; the page's requests of anything but local
files are listed (the theme's web fonts may be asked for and fall back; nothing that search needs
may be). Without Chromium: exit 1 under CI (``.ci/run`` installs it), else a note and exit 0.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

QUERY = "definition site"
FONTS = ("https://fonts.googleapis.com/", "https://fonts.gstatic.com/")  # may fail: fall back
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
         "--window-size=1280,900", "--host-resolver-rules=MAP * ~NOTFOUND")


def main(argv: list[str]) -> int:
    site = Path(argv[0] if argv else "site").resolve()
    index = site / "index.html"
    if not index.is_file():
        print(f"check_offline_search: no {index}: build the site first", file=sys.stderr)
        return 1
    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        what = ("check_offline_search: Chromium and its driver are needed (Debian: apt-get "
                "install chromium chromium-driver)")
        if os.environ.get("CI"):
            print(what, file=sys.stderr)
            return 1
        print(f"{what}: not checked here")
        return 0
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never download a driver
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with tempfile.TemporaryDirectory(prefix="offline-search-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        chrome = webdriver.Chrome(options=options,
                                  service=webdriver.ChromeService(executable_path=driver))
        try:
            chrome.execute_cdp_cmd("Network.enable", {})
            chrome.execute_cdp_cmd("Network.emulateNetworkConditions", {
                "offline": True, "latency": 0, "downloadThroughput": -1,
                "uploadThroughput": -1})
            chrome.get(index.as_uri())
            wait = WebDriverWait(chrome, 30)
            try:
                box = wait.until(lambda c: next(
                    (e for e in c.find_elements(By.CSS_SELECTOR, "input.md-search__input")
                     if e.is_displayed()), False))
                box.click()
                box.send_keys(QUERY)
                wait.until(lambda c: c.find_elements(By.CSS_SELECTOR,
                                                     "li.md-search-result__item"))
                time.sleep(0.5)  # (results render in one batch; let it finish)
            except TimeoutException:
                return _fail(chrome, "no search results came (the search box did not show, or "
                                     "it found nothing)")
            meta = chrome.find_element(By.CSS_SELECTOR, ".md-search-result__meta").text
            titles = [e.text.splitlines()[0] for e in chrome.find_elements(
                By.CSS_SELECTOR, "li.md-search-result__item h1") if e.text][:5]
            remote = _remote_requests(chrome)
        finally:
            chrome.quit()
    needed = [url for url in remote if not url.startswith(FONTS)]
    print(f"check_offline_search: {index.as_uri()}, network off, query {QUERY!r}: {meta}; "
          f"first: {', '.join(titles)}")
    if remote:
        print(f"  asked the network for (failed, offline): {', '.join(sorted(set(remote)))}")
    if needed:
        print(f"check_offline_search: the page needs the network for {needed}", file=sys.stderr)
        return 1
    return 0 if titles else 1


def _remote_requests(chrome: object) -> list[str]:
    urls = []
    for entry in chrome.get_log("performance"):  # type: ignore[attr-defined]
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if url.startswith(("http:", "https:")):
                urls.append(url)
    return urls


def _fail(chrome: object, why: str) -> int:
    print(f"check_offline_search: {why}", file=sys.stderr)
    for url in sorted(set(_remote_requests(chrome))):
        print(f"  asked the network for {url}", file=sys.stderr)
    for entry in chrome.get_log("browser"):  # type: ignore[attr-defined]
        print(f"  console: {entry.get('message')}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
