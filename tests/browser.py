"""Headless Chromium driven through the DevTools protocol, for the tests of the pages the
project writes (the HTML report) and serves (the page of `translate serve`). Debian's `chromium`:
the CI installs it, and TRANSLATE_REQUIRE_CHROMIUM=1 makes a missing one a failure, not a skip."""

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
]  # fmt: skip


def _high_fd(fd: int) -> int:
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Browser:
    """Headless Chromium driven through the DevTools protocol over a pipe (its fds 3 and 4):
    every event (network requests, console messages, exceptions) is kept in `events`."""

    def __init__(self, profile: Path, width: int = 1200, height: int = 900) -> None:
        to_browser_r, self.to_browser = map(_high_fd, os.pipe())
        self.from_browser, from_browser_w = map(_high_fd, os.pipe())

        def child() -> None:
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        args = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(
            args, pass_fds=(3, 4), preexec_fn=child,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer, self.next_id, self.events, self.session = b"", 0, [], None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def _receive(self, timeout: float = 30.0) -> dict:
        end = time.monotonic() + timeout
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.from_browser], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed its pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, _wait: float = 30.0, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive(_wait)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def open(self, url: str) -> list[dict]:
        """Load a page; returns the events of its loading."""
        since = len(self.events)
        self.call("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events[since:]):
            self.events.append(self._receive())
        self.run("new Promise(r => setTimeout(r, 100))")  # late requests and messages arrive too
        return self.events[since:]

    def run(self, expression: str, wait: float = 30.0):
        result = self.call("Runtime.evaluate", _wait=wait, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def type(self, selector: str, text: str) -> None:
        """Focus the element and type `text` into it, as a keyboard would (input events fire)."""
        self.run(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def press(self, key: str, code: int) -> None:
        """A key pressed and released on the focused element (`key` as KeyboardEvent.key, `code` its key code)."""
        for kind in ("rawKeyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code)

    def click(self, selector: str) -> None:
        """A mouse click at the middle of the element, as a user's."""
        x, y = self.run(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}}); "
            "const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def wait_for(self, condition: str, timeout: float = 60.0):
        """The value of the JavaScript expression `condition` once it is truthy (polled in the page)."""
        return self.run(
            f"new Promise((resolve, reject) => {{ const end = Date.now() + {int(timeout * 1000)}; "
            f"(function poll() {{ const v = ({condition}); if (v) resolve(v); "
            "else if (Date.now() > end) reject(new Error('timed out waiting')); else setTimeout(poll, 50); })(); })",
            wait=timeout + 10,
        )

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)


def problems(events: list[dict], own: str = "file:") -> dict[str, list]:
    """Requests to anything but the page's own origin (`own`: a prefix of their URLs; its own
    file by default), errors, exceptions and console errors."""
    requests = [
        e["params"]["request"]["url"]
        for e in events
        if e.get("method") == "Network.requestWillBeSent" and not e["params"]["request"]["url"].startswith(own)
    ]
    errors = [
        e["params"]["entry"]["text"]
        for e in events
        if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning")
    ]
    errors += [str(e["params"]) for e in events if e.get("method") == "Runtime.exceptionThrown"]
    errors += [
        str(e["params"]["args"])
        for e in events
        if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "warning", "assert")
    ]
    return {"requests": requests, "errors": errors}


def open_browser(tmp_path_factory):
    """A Browser for a module-scoped fixture (yields it, closes it); skips where chromium is missing."""
    if CHROMIUM is None:
        if os.environ.get("TRANSLATE_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required here (TRANSLATE_REQUIRE_CHROMIUM is set) but not installed")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()
