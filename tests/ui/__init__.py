"""The web dashboard in a real browser: Debian's headless Chromium, driven by Selenium."""
