#!/usr/bin/python3
"""A stand-in for a scheduler's HTTP port in tests/tmux/test_top.sh: serves the current
content of a file at GET /metrics (re-read on every request, so a test changes what the next
poll sees by replacing the file), "ok" at /healthz, 404 elsewhere, 401 without the bearer
token when --token is given. --mode says how the body is delimited: length (Content-Length),
close (none: the body ends with the connection) or chunked (Transfer-Encoding: chunked), so
each of the client's three ways of reading a body is exercised. The chosen port is written
to --port-file once the socket listens."""
import argparse
import http.server
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--token")
    ap.add_argument("--mode", choices=["length", "close", "chunked"], default="length")
    a = ap.parse_args()

    class Handler(http.server.BaseHTTPRequestHandler):
        # HTTP/1.1 for chunked; close after every answer either way.
        protocol_version = "HTTP/1.1" if a.mode == "chunked" else "HTTP/1.0"

        def log_message(self, fmt, *args):
            pass

        def answer(self, code, body, ctype="text/plain; version=0.0.4; charset=utf-8"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Connection", "close")
            if a.mode == "length" or code != 200:
                self.send_header("Content-Length", str(len(body)))
            elif a.mode == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if a.mode == "chunked" and code == 200:
                # Uneven chunks, one with an extension, to exercise the decoder.
                step = 700
                for i in range(0, len(body), step):
                    part = body[i:i + step]
                    ext = ";x=1" if i == 0 else ""
                    self.wfile.write(b"%x%s\r\n%s\r\n" % (len(part), ext.encode(), part))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.wfile.write(body)
            self.close_connection = True

        def do_GET(self):
            if self.path == "/healthz":
                return self.answer(200, b"ok\n")
            if self.path != "/metrics":
                return self.answer(404, b"not found\n")
            if a.token and self.headers.get("Authorization") != "Bearer " + a.token:
                return self.answer(401, b"unauthorized\n")
            with open(a.file, "rb") as f:
                self.answer(200, f.read())

    srv = http.server.HTTPServer(("127.0.0.1", a.port), Handler)
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % srv.server_address[1])
        os.replace(tmp, a.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
