#!/usr/bin/env python3
"""How fast a site takes pushed logs: HTTP, RELP, TCP and UDP into its spool, alone.

Usage: python scripts/bench_push.py [--lines 200000] [--batch 1000] [--roll 0.2]
                                     [--udp-rate 10000] [--dir D]

A child process runs what ``jetstream site --push-http --syslog-relp --syslog-tcp
--syslog-udp`` runs (a spool into a folder under ``--dir``, its HTTP server and syslog
listeners), and nothing else: no Spark. This process sends it ``--lines`` CDN log lines as
JSON over each transport in turn, as fast as the transport lets it -- HTTP in keyed POSTs of
``--batch`` lines from 4 connections, each answered once on disk; RELP with a window of 10,000
messages, each answered once on disk; TCP in octet-counted frames on one connection, until
the lines are on disk; UDP on one socket at ``--udp-rate`` datagrams a second, until they
are read or 10 s pass -- and prints the lines a second and the child's CPU seconds
per million lines (its /proc/PID/stat). The sender's own work is not counted, but it shares
the machine's cores with the child; the lines are made before the clock starts.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RECORD = {"ts": "1796160000000", "pop": "sfo", "client_ip": "198.51.100.7",
          "domain": "site17.example.com", "url": "/video/segment-0042.ts", "status": "200",
          "bytes": "48213", "latency_ms": "12.5", "cache": "HIT"}


def serve(folder: Path) -> None:
    """The child: a site's push and syslog listeners on free loopback ports, printed."""
    from jetstream.stage.push import Spool, serve_push
    from jetstream.stage.syslog import Intake, serve_syslog

    spool = Spool(folder / "in", folder / "state", site="bench", roll_s=float(sys.argv[3]))
    http_server = serve_push(("127.0.0.1", 0), spool, max_request_bytes=64 << 20)
    udp, tcp, relp = serve_syslog(Intake(spool, key_field="request_id"), udp=(
        "127.0.0.1", 0), tcp=("127.0.0.1", 0), relp=("127.0.0.1", 0))
    ports = {"http": http_server.server_address[1], "udp": udp.address[1],
             "tcp": tcp.address[1], "relp": relp.address[1]}
    print(json.dumps(ports), flush=True)
    sys.stdin.read()  # until the parent is done


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def on_disk(folder: Path) -> int:
    total = 0
    for path in folder.glob("push-*.jsonl"):
        with path.open("rb") as fh:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return total


def lines(n: int, start: int, tag: str) -> list[bytes]:
    return [json.dumps({**RECORD, "request_id": f"{tag}-{start + i}"}).encode()
            for i in range(n)]


def send_http(port: int, bodies: list[bytes]) -> None:
    def worker(mine: list[tuple[int, bytes]]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for at, body in mine:
            conn.request("POST", "/", body, {"Idempotency-Key": f"http-{at}"})
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200, answer.status
    numbered = list(enumerate(bodies))
    threads = [threading.Thread(target=worker, args=(numbered[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def send_relp(port: int, messages: list[bytes], window: int = 10_000) -> None:
    conn = socket.create_connection(("127.0.0.1", port))
    stream = conn.makefile("rb")
    offers = b"relp_version=0\nrelp_software=bench\ncommands=syslog"
    conn.sendall(b"1 open %d %s\n" % (len(offers), offers))
    while not stream.readline().startswith(b"commands="):  # the answer's offers
        pass
    acked = threading.Semaphore(window)

    def read_acks() -> None:
        for _ in messages:
            assert stream.readline().split(b" ")[1] == b"rsp"
            acked.release()

    reader = threading.Thread(target=read_acks)
    reader.start()
    for i, message in enumerate(messages):
        acked.acquire()
        conn.sendall(b"%d syslog %d %s\n" % (i + 2, len(message), message))
    reader.join()
    conn.close()


def send_tcp(port: int, chunks: list[bytes], folder: Path, until: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for chunk in chunks:
            conn.sendall(chunk)
    while on_disk(folder) < until:
        time.sleep(0.05)


def send_udp(port: int, datagrams: list[bytes], rate: float, folder: Path, until: int) -> int:
    """The datagrams at ``rate`` a second (bursts of 100); how many were lost."""
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    began = time.perf_counter()
    for i, datagram in enumerate(datagrams):
        sender.sendto(datagram, ("127.0.0.1", port))
        if i % 100 == 99:
            time.sleep(max(0.0, began + (i + 1) / rate - time.perf_counter()))
    deadline = time.monotonic() + 10
    while on_disk(folder) < until and time.monotonic() < deadline:
        time.sleep(0.05)
    return until - on_disk(folder)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000, help="lines a transport")
    parser.add_argument("--batch", type=int, default=1000, help="lines an HTTP POST")
    parser.add_argument("--roll", type=float, default=0.2, help="the spool's roll (s)")
    parser.add_argument("--udp-rate", type=float, default=10_000,
                        help="datagrams a second sent over UDP")
    parser.add_argument("--dir", type=Path, help="where the spool writes (a temporary folder)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-push-", dir=args.dir))
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(folder), str(args.roll)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    ports = json.loads(child.stdout.readline())
    print(f"{args.lines:,} lines of {len(lines(1, 0, 'x')[0]) + 1} bytes a transport, a "
          f"roll of {args.roll:g}s, spooled under {folder}")
    syslog = [b"<134>1 - edge nginx - - - " + line for line in lines(args.lines, 0, "s")]
    frames = [b"%d %s" % (len(m), m) for m in syslog]
    payloads = {
        "http": [b"\n".join(lines(min(args.batch, args.lines - at), at, "http")) + b"\n"
                 for at in range(0, args.lines, args.batch)],
        "relp": [b"<134>1 - edge nginx - - - " + line for line in lines(args.lines, 0, "r")],
        "tcp": [b"".join(frames[i:i + 1000]) for i in range(0, len(frames), 1000)],
        "udp": [b"<134>Dec  1 22:00:00 nginx: " + line for line in lines(args.lines, 0, "u")]}
    try:
        for transport, payload in payloads.items():
            before, cpu, began = on_disk(folder / "in"), cpu_s(child.pid), time.perf_counter()
            lost = 0
            if transport == "http":
                send_http(ports["http"], payload)
            elif transport == "relp":
                send_relp(ports["relp"], payload)
            elif transport == "tcp":
                send_tcp(ports["tcp"], payload, folder / "in", before + args.lines)
            else:
                lost = send_udp(ports["udp"], payload, args.udp_rate, folder / "in",
                                before + args.lines)
            took, used = time.perf_counter() - began, cpu_s(child.pid) - cpu
            taken = on_disk(folder / "in") - before
            print(f"{transport:5} {taken / took:>9,.0f} lines/s, child CPU "
                  f"{used / taken * 1e6:6.1f} s per million lines"
                  + (f" (sent at {args.udp_rate:,.0f}/s: {lost:,} lost)"
                     if transport == "udp" else ""))
    finally:
        child.stdin.close()
        child.wait(10)


if __name__ == "__main__":
    main()
