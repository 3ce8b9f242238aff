"""Runs a command on a pseudo-terminal of its own and plays a script of keystrokes, window
sizes and checks at it, as a person at a terminal would: the `sandkit run -t` and `sandkit shell`
specs' terminal.

    python3 pty_driver.py SCRIPT.json -- ARGV...

SCRIPT is a list of steps, each one of
    {"send": "text"}                  bytes typed (JSON escapes: "\\r" is Enter, "\\u0003" Ctrl-C)
    {"expect": "text", "within": S}   wait until the output so far holds text, at most S seconds
    {"size": [cols, rows]}            resize the terminal; the command gets SIGWINCH
    {"settings": "name"}              record the terminal's settings under name
    {"signal": "TERM"}                send the command a signal
The terminal's settings are also recorded before the command runs ("initial") and once it
has ended ("final"). The driver prints one JSON line: {"ok": bool, "failed": step index or null, "status": exit
status, "settings": {name: ...}, "output": the tail of what the command wrote}. Every wait is
bounded; the command is killed if it outlives the script by 20 seconds.
"""
import fcntl
import json
import os
import pty
import select
import signal
import struct
import sys
import termios
import time

TAIL = 4000


def main():
    script = json.load(open(sys.argv[1]))
    argv = sys.argv[sys.argv.index("--") + 1:]
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(argv[0], argv)
    out = bytearray()
    settings = {}

    def size(cols, rows):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def pump(seconds):
        r, _, _ = select.select([fd], [], [], seconds)
        if r:
            try:
                out.extend(os.read(fd, 65536))
            except OSError:
                return False
        return True

    size(80, 24)
    settings["initial"] = list(map(str, termios.tcgetattr(fd)[:4]))
    failed = None
    for i, step in enumerate(script):
        if "send" in step:
            os.write(fd, step["send"].encode())
        elif "size" in step:
            size(*step["size"])
            os.kill(pid, signal.SIGWINCH)
        elif "signal" in step:
            os.kill(pid, getattr(signal, "SIG" + step["signal"]))
        elif "settings" in step:
            settings[step["settings"]] = list(map(str, termios.tcgetattr(fd)[:4]))
        elif "expect" in step:
            want = step["expect"].encode()
            end = time.time() + step.get("within", 10)
            while want not in out and time.time() < end:
                if not pump(0.05):
                    break
            if want not in out:
                failed = i
                break
    end = time.time() + 20
    status = None
    while time.time() < end:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
            break
        pump(0.05)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    while select.select([fd], [], [], 0)[0] and pump(0):
        pass
    settings["final"] = list(map(str, termios.tcgetattr(fd)[:4]))
    print(json.dumps({"ok": failed is None, "failed": failed, "status": status,
                      "settings": settings, "output": out[-TAIL:].decode("utf-8", "replace")}))


main()
