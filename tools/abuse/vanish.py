"""vanish.py PORT TOKEN COUNT SECONDS -- COUNT callers that start an authorized exec of a silent
command (`sleep SECONDS`) on the agent at 127.0.0.1:PORT, read the answer's head, and vanish:
each socket is put in TCP repair mode and closed, so the kernel drops it without a FIN or a
reset, as a caller whose machine or network died would. The agent is then left with COUNT
connections nobody is at, whose commands say nothing: only TCP keep-alive can tell. Prints
"vanished N". Needs CAP_NET_ADMIN (root) for TCP repair; tools/abuse/run.lua runs it.
"""
import json
import socket
import sys

# linux/tcp.h: a socket in repair mode is closed without anything sent to its peer.
TCP_REPAIR = 19


def main():
    port, token, count, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    body = json.dumps({"command": ["sleep", str(seconds)], "timeoutMs": seconds * 1000}).encode()
    head = ("POST /v1/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (token, len(body))).encode()
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", int(port)), timeout=5)
        s.sendall(head + body)
        got = b""
        while b"\r\n\r\n" not in got:
            piece = s.recv(4096)
            if not piece:
                raise SystemExit("the agent closed a connection before answering")
            got += piece
        if not got.startswith(b"HTTP/1.1 200 "):
            raise SystemExit("the agent answered " + got.split(b"\r\n", 1)[0].decode())
        socks.append(s)
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
        s.close()
    print("vanished", len(socks), flush=True)


main()
