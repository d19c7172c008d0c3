"""A screenshot of the dashboard's fleet page in headless Chromium (Debian's chromium and
chromium-driver), for `make demo`: waits for the page to answer and refresh once, then saves
the PNG. Says why and exits 0 where no browser is installed (the demo goes on)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.request


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the dashboard to answer")
    args = parser.parse_args()
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        print("dashboard screenshot: skipped (no chromium and chromium-driver here)", file=sys.stderr)
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        try:
            with urllib.request.urlopen(args.url + "api/fleet.json", timeout=5) as response:
                if json.loads(response.read()).get("collecting") is False:  # the first collection is in
                    break
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            print(f"dashboard screenshot: skipped ({args.url} did not answer within {args.wait:g} s)", file=sys.stderr)
            return 0
        time.sleep(1)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1500,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(args.url)
        deadline = time.monotonic() + 30
        while not driver.execute_script("return document.body.dataset.refreshes") and time.monotonic() < deadline:
            time.sleep(0.2)
        driver.save_screenshot(args.out)
    finally:
        driver.quit()
    print(f"dashboard screenshot: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
