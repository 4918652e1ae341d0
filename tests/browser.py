"""Headless Chromium driven by selenium, for tests that check what a person would see."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")


def chromium_binaries() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        raise RuntimeError("chromium and chromedriver are not installed; the README's test "
                           "command installs them (Debian packages chromium, chromium-driver)")
    return browser, driver


class Browser:
    """One Chromium with a fresh profile, a fixed window size (stable screenshots)."""

    def __init__(self, width: int = 1400, height: int = 1000, dark: bool = False) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        browser, driver = chromium_binaries()
        self.profile = tempfile.mkdtemp(prefix="gpuwatch-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = browser
        for flag in FLAGS:
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={self.profile}")
        opts.add_argument(f"--window-size={width},{height}")
        if dark:
            opts.add_argument("--force-dark-mode")
            opts.add_argument("--blink-settings=preferredColorScheme=0")
        self.driver = webdriver.Chrome(service=Service(driver), options=opts)
        self.driver.set_page_load_timeout(30)
        self.viewport: int | None = None
        if width < 500:  # below Chromium's smallest window: a phone's viewport, emulated
            self.viewport = width
            self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": height, "deviceScaleFactor": 1, "mobile": True})

    def get(self, url: str) -> None:
        self.driver.get(url)

    def text(self, css: str) -> list[str]:
        """The rendered text of every match, read in one script: the page replaces its
        sections as it refreshes, so elements found in one call may be gone in the next."""
        return self.js("return [...document.querySelectorAll(arguments[0])]"
                       ".map(e => (e.innerText ?? e.textContent).trim())", css)

    def count(self, css: str) -> int:
        from selenium.webdriver.common.by import By

        return len(self.driver.find_elements(By.CSS_SELECTOR, css))

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def screenshot(self, path: Path, full_page: bool = True) -> None:
        """The whole page (the window grown to the document's height), as PNG."""
        if full_page:
            height = self.js("return document.documentElement.scrollHeight")
            if self.viewport is not None:
                self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                    "width": self.viewport, "height": min(int(height), 6000),
                    "deviceScaleFactor": 1, "mobile": True})
            else:
                width = self.driver.get_window_size()["width"]
                self.driver.set_window_size(width, min(int(height) + 120, 6000))
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)
