"""A web app installed from its pyproject.toml: it answers on $PORT."""
import os
from http.server import BaseHTTPRequestHandler, HTTPServer

from hello_app import hello


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = (hello() + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


HTTPServer(("0.0.0.0", int(os.environ.get("PORT", "8080"))), Handler).serve_forever()
