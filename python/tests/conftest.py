"""Shared fixtures: a fake OpenAI-compatible server on 127.0.0.1 for the default HTTP
provider (``base_url``), and canned provider responses."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


def response(content="ok", tool_calls=None):
    """An OpenAI-style chat completion."""
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"choices": [{"message": message}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def tool_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class FakeModel:
    """Answers every POST with the next canned body; records requests and headers."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []
        self.headers = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length", "0"))
                model.requests.append(json.loads(self.rfile.read(length) or b"null"))
                model.headers.append({k.lower(): v for k, v in self.headers.items()})
                body = json.dumps(model.answers.pop(0) if model.answers else response("no more")).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_model():
    models = []

    def start(answers):
        model = FakeModel(answers)
        models.append(model)
        return model

    yield start
    for model in models:
        model.close()


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server for the session (``pg.py``)."""
    from pg import Cluster

    cluster = Cluster()
    yield cluster
    cluster.stop()
