"""Decoding in Python, as a Python program would do it: lines split from 16 KiB reads, each
parsed by json.loads, the payload decoded by base64.b64decode.

    python3 bench/peers/decode.py CORPUS

Same rules as bench/decode_loop.lua: chunks cut before the clock starts, at least 3 passes and
1 second, the fastest pass reported. Prints one line: RESULT <json>.
"""
import base64
import json
import sys
import time

CHUNK = 16 * 1024
MIN_PASSES = 3
MIN_SECONDS = 1.0


def one_pass(chunks):
    frames = nbytes = check = 0
    pending = b""
    for chunk in chunks:
        buf = pending + chunk if pending else chunk
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            frame = json.loads(buf[start:nl])
            start = nl + 1
            frames += 1
            if frame["t"] in ("stdout", "stderr"):
                data = base64.b64decode(frame["data"])
                nbytes += len(data)
                check += data[0] + data[-1]
        pending = buf[start:]
    return frames, nbytes, check


def main():
    with open(sys.argv[1], "rb") as f:
        text = f.read()
    chunks = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)]
    passes, total, best = 0, 0.0, float("inf")
    while passes < MIN_PASSES or total < MIN_SECONDS:
        t0 = time.perf_counter()
        frames, nbytes, check = one_pass(chunks)
        dt = time.perf_counter() - t0
        passes += 1
        total += dt
        best = min(best, dt)
    print("RESULT " + json.dumps({"passes": passes, "best_seconds": best, "frames": frames,
                                  "bytes": nbytes, "check": check}))


main()
