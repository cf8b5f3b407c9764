# An app that brings only a Procfile, as Heroku apps do: python3 and its standard
# library, from the stack image.
import http.server
import os
import sys


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from python {sys.version_info.major}.{sys.version_info.minor} on the stack\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


http.server.ThreadingHTTPServer(("", int(os.environ.get("PORT", "8080"))), Hello).serve_forever()
