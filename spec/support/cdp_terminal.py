"""Drives the OpenResty example's terminal page in headless Chromium over the DevTools
protocol, as a person would: types `echo $((6*7))` and Enter and waits for 42, resizes the
window and checks that `stty size` follows, then closes the page and asks the gateway whether
the shell is gone.

    python3 cdp_terminal.py CHROMIUM PROFILE_DIR BASE_URL TOKEN

Prints one JSON line: {"ok": bool, "step": what failed or null, "session": id, "size":
[cols, rows] after the resize, "stty": what stty size printed, "gone_after": seconds from the
page's close until the gateway listed the shell's job as ended (null: it did not within 5 s),
"text": the terminal's text at the end}. Every wait is bounded.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

import websocket

chromium, profile, base, token = sys.argv[1:5]


def wait_for(predicate, seconds, step):
    end = time.time() + seconds
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(step)


class Page:
    def __init__(self, url):
        self.ws = websocket.create_connection(url, timeout=30)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(method + ": " + json.dumps(message["error"]))
                return message.get("result", {})

    def js(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def type(self, text):
        self.call("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                      windowsVirtualKeyCode=13, nativeVirtualKeyCode=13,
                      **({"text": "\r"} if kind == "keyDown" else {}))


def jobs(session):
    request = urllib.request.Request(base + "/sessions/" + session + "/jobs",
                                     headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["jobs"]


def main():
    browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--disable-background-networking", "--disable-component-update",
                                "--disable-sync", "--remote-debugging-port=0", "--window-size=800,600",
                                "--user-data-dir=" + profile, "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    report = {"ok": False, "step": None, "session": None, "size": None, "stty": None, "gone_after": None,
              "text": None}
    page = None
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        port = wait_for(lambda: os.path.exists(port_file) and open(port_file).read().split("\n")[0], 30,
                        "Chromium's DevTools port")
        targets = json.load(urllib.request.urlopen("http://127.0.0.1:%s/json/list" % port, timeout=10))
        target = [t for t in targets if t["type"] == "page"][0]
        page = Page(target["webSocketDebuggerUrl"])
        page.call("Page.enable")
        page.call("Page.navigate", url=base + "/terminal#token=" + token)
        wait_for(lambda: page.js("window.sandkitTerminal && window.sandkitTerminal.ready"), 30, "the page connects")
        report["session"] = page.js("window.sandkitTerminal.session")
        wait_for(lambda: "$ " in (page.js("window.sandkitTerminal.text()") or ""), 30, "the shell's prompt")
        page.js("window.sandkitTerminal.focus()")
        page.type("echo $((6*7))")
        wait_for(lambda: "\n42\n" in page.js("window.sandkitTerminal.text()") + "\n", 15, "42 on the terminal")
        before = page.js("window.sandkitTerminal.size()")
        page.call("Emulation.setDeviceMetricsOverride", width=1200, height=760, deviceScaleFactor=1, mobile=False)
        size = wait_for(lambda: (lambda s: s if s != before else None)(page.js("window.sandkitTerminal.size()")),
                        10, "the terminal's new size")
        report["size"] = size
        page.type("stty size")
        want = "%d %d" % (size[1], size[0])
        wait_for(lambda: want in page.js("window.sandkitTerminal.text()"), 15, "stty size follows: " + want)
        report["stty"] = want
        report["text"] = page.js("window.sandkitTerminal.text()")
        closed = time.time()
        page.call("Page.close")
        session = report["session"]

        def ended():
            shells = [j for j in jobs(session) if j.get("pty")]
            return shells and not any(j["running"] for j in shells)
        wait_for(ended, 5, "the shell ends with the page")
        report["gone_after"] = time.time() - closed
        report["ok"] = True
    except Exception as e:  # the report says which step failed
        report["step"] = str(e)
        if page is not None and report["text"] is None:
            try:
                report["text"] = page.js("window.sandkitTerminal && window.sandkitTerminal.text()")
            except Exception:
                pass
    finally:
        os.killpg(browser.pid, 9)
        browser.wait()
    print(json.dumps(report))


main()
