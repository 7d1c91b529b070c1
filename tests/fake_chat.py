"""A local OpenAI-style chat-completions server (standard library only, no network): it records
every request and answers each with the next of its canned replies (the last one repeats)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeChat:
    def __init__(self, replies: list[str]):
        self.replies, self.requests = list(replies), []
        chat = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                chat.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                text = chat.replies[min(len(chat.requests), len(chat.replies)) - 1]
                out = json.dumps(
                    {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
