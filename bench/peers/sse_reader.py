"""A reader for bench/gateway.lua whose cost per byte does not grow with its streams.

    python3 sse_reader.py HEADERS_FILE BODY_FILE CONFIG_FILE [AT_ONCE]

Reads the same inputs as the `curl --parallel --parallel-max AT_ONCE` it stands in for (a file
of request headers, the request body, a curl config of `url = "…"` lines), POSTs to AT_ONCE of
the URLs (all of them by default) over HTTP/1.1, each next one as soon as one ended, and reads
every response body to its end through one selector, so each wakeup costs work only for
the sockets that are ready (libcurl's multi interface, which `curl --parallel` drives, walks
every transfer on each pass). Prints "STATUS BODY_BYTES" per URL, in order, as curl's
`-w "%{http_code} %{size_download}\\n"` does.
"""

import selectors
import socket
import sys

# As much as one read takes: what the gateway writes per frame fits with room to spare.
READ_SIZE = 256 * 1024
# A response head longer than this is not the gateway's.
MAX_HEAD = 16 * 1024


class Response:
    """One request's answer: its status, then its body, chunked or delimited by the close."""

    def __init__(self):
        self.pending = b""
        self.status = None
        self.chunked = False
        self.chunk_left = 0
        self.body_bytes = 0
        self.done = False

    def feed(self, data):
        """data: a memoryview of what one read took; body bytes are counted, never copied."""
        at = 0
        if self.status is None:
            self.pending += bytes(data)
            end = self.pending.find(b"\r\n\r\n")
            if end < 0:
                if len(self.pending) > MAX_HEAD:
                    raise ValueError("a response head over %d bytes" % MAX_HEAD)
                return
            head = self.pending[:end].decode("latin-1").split("\r\n")
            self.status = int(head[0].split(" ")[1])
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                    self.chunked = True
            at = len(data) - (len(self.pending) - (end + 4))
            self.pending = b""
        if not self.chunked:
            self.body_bytes += len(data) - at
            return
        while not self.done and at < len(data):
            if self.chunk_left > 0:
                take = min(self.chunk_left, len(data) - at)
                self.body_bytes += take
                self.chunk_left -= take
                at += take
                if self.chunk_left == 0:
                    self.chunk_left = -2  # the CRLF after a chunk's data
                continue
            if self.chunk_left < 0:
                self.chunk_left += 1
                at += 1
                continue
            # A chunk-size line: a few bytes, kept until its CRLF arrives.
            kept = len(self.pending)
            self.pending += bytes(data[at:at + 32])
            end = self.pending.find(b"\r\n")
            if end < 0:
                if len(self.pending) > MAX_HEAD:
                    raise ValueError("a chunk-size line over %d bytes" % MAX_HEAD)
                at = min(at + 32, len(data))
                continue
            at += end + 2 - kept
            size = int(self.pending[:end].split(b";")[0], 16)
            self.pending = b""
            if size == 0:
                self.done = True
            else:
                self.chunk_left = size


def main():
    headers = [line for line in open(sys.argv[1]).read().splitlines() if line]
    body = open(sys.argv[2], "rb").read()
    urls = [line.split('"')[1] for line in open(sys.argv[3]) if line.startswith("url")]
    at_once = int(sys.argv[4]) if len(sys.argv) > 4 else len(urls)
    selector = selectors.DefaultSelector()
    responses = [Response() for _ in urls]

    def start(index):
        authority, _, path = urls[index][len("http://"):].partition("/")
        host, _, port = authority.partition(":")
        sock = socket.create_connection((host, int(port)))
        request = "POST /%s HTTP/1.1\r\nHost: %s\r\n%s\r\nContent-Length: %d\r\n\r\n" % (
            path, authority, "\r\n".join(headers), len(body))
        sock.sendall(request.encode("latin-1") + body)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, index)

    started = min(at_once, len(urls))
    for index in range(started):
        start(index)
    buffer = bytearray(READ_SIZE)
    view = memoryview(buffer)
    open_streams = started
    while open_streams:
        for key, _ in selector.select():
            response = responses[key.data]
            n = key.fileobj.recv_into(buffer)
            if n:
                response.feed(view[:n])
            if n == 0 or response.done:
                selector.unregister(key.fileobj)
                key.fileobj.close()
                open_streams -= 1
                if started < len(urls):
                    start(started)
                    started += 1
                    open_streams += 1
    for response in responses:
        print(response.status or 0, response.body_bytes if response.done or not response.chunked else 0)


main()
