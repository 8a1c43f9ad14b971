"""Pytest plugin: a real moto EC2 server on 127.0.0.1 for the aws provider's tests.

Enable with ``pytest_plugins = ["tests.motofixtures"]`` in tests/conftest.py. boto3 talks to
moto over HTTP on loopback (never patched); the environment points every poprun-py process at it
and can reach nothing else: fake credentials, ``AWS_EC2_METADATA_DISABLED`` (no instance-metadata
lookups), no config or credentials files. Requests to loopback never go through a proxy that the
runner's ``http_proxy``/``HTTPS_PROXY``... name: the fixtures' own requests use no proxy, and
``NO_PROXY``/``no_proxy`` get 127.0.0.1 and localhost for boto3 here and in every process started.

Fixtures:

- ``moto_url``: the server's URL, one server per session (``ThreadedMotoServer``, port 0).
- ``aws_env``: a fresh moto (state reset) and the environment for poprun-py, function-scoped:
  ``POPRUN_PY_AWS_ENDPOINT_URL``, ``POPRUN_PY_STATE_DIR`` (a tmp dir) and
  ``POPRUN_PY_AWS_SKIP_SSH_WAIT=1`` (moto's instances cannot be reached by SSH). Gives an
  :class:`AwsEnv` with an ``ec2`` client for assertions and a usable ``image_id``.
- ``ec2_proxy``: an HTTP proxy in front of moto (:class:`Ec2Proxy`) that forwards every request
  but, for the EC2 actions in ``proxy.hold``, never answers once it has forwarded one (a process
  whose request is held can be killed at that exact point; ``proxy.held`` is set then), and
  answers the actions in ``proxy.fail`` with an EC2 error of the given code after the given
  number of successful calls (quota errors, which moto cannot produce).

Example::

    def test_up(aws_env):
        ...
        assert aws_env.ec2.describe_key_pairs()["KeyPairs"]
"""

from __future__ import annotations

import functools
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"
IMAGE_ID = "ami-785db401"  # one of moto's default images (ubuntu xenial), in every region
IMAGE_NAME = "ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-20170721"
_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_REGION",
)
LOOPBACK = ("127.0.0.1", "localhost")
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # whatever http_proxy says


@dataclass
class AwsEnv:
    """The moto server as poprun-py sees it in one test."""

    url: str
    region: str
    state_dir: Path
    image_id: str
    image_name: str

    @functools.cached_property
    def ec2(self) -> Any:
        """A boto3 EC2 client on moto, for assertions (made once: clients are slow to make)."""
        import boto3

        return boto3.client("ec2", region_name=self.region, endpoint_url=self.url)

    @property
    def clusters_dir(self) -> Path:
        return self.state_dir / "clusters"


def isolate_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials and no way for boto3 to look anywhere but the environment; loopback
    reached directly, whatever proxy the environment names."""
    no_proxy(monkeypatch)
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """``NO_PROXY`` and ``no_proxy`` list loopback besides what they had (boto3, urllib)."""
    for name in ("NO_PROXY", "no_proxy"):
        had = [h for h in os.environ.get(name, "").split(",") if h.strip()]
        monkeypatch.setenv(name, ",".join([*had, *(h for h in LOOPBACK if h not in had)]))


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """One moto server for the session, on 127.0.0.1 and a free port."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def _reset(url: str) -> None:
    request = urllib.request.Request(f"{url}/moto-api/reset", data=b"", method="POST")
    with _direct.open(request, timeout=10) as response:  # loopback only
        response.read()


@pytest.fixture
def aws_env(moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AwsEnv:
    """A freshly reset moto and the environment that points poprun-py at it."""
    isolate_aws(monkeypatch, tmp_path)
    _reset(moto_url)
    state_dir = tmp_path / "state"
    monkeypatch.setenv("POPRUN_PY_STATE_DIR", str(state_dir))
    monkeypatch.setenv("POPRUN_PY_AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("POPRUN_PY_AWS_SKIP_SSH_WAIT", "1")
    return AwsEnv(moto_url, REGION, state_dir, IMAGE_ID, IMAGE_NAME)


_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error></Errors><RequestID>proxy</RequestID></Response>"
)


class Ec2Proxy:
    """Forwards HTTP requests to moto; holds or fails the EC2 actions it is told to."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.hold: set[str] = set()
        self.fail: dict[str, tuple[int, str, str]] = {}  # action -> (successes first, code, msg)
        self.held = threading.Event()  # set once a held request has reached moto
        self.release = threading.Event()
        self.actions: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                action = urllib.parse.parse_qs(body.decode()).get("Action", [""])[0]
                proxy.actions.append(action)
                if action in proxy.fail and proxy.actions.count(action) > proxy.fail[action][0]:
                    _, code, message = proxy.fail[action]
                    payload = _ERROR_XML.format(code=code, message=message).encode()
                    self.send_response(400)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                status, headers, payload = proxy.forward(self.path, dict(self.headers), body)
                if action in proxy.hold:
                    proxy.held.set()
                    proxy.release.wait(60)
                    return  # never answer: the client is killed meanwhile
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def forward(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        request = urllib.request.Request(self.upstream + path, data=body, method="POST")
        for key, value in headers.items():
            if key.lower() not in ("host", "content-length", "connection"):
                request.add_header(key, value)
        try:
            with _direct.open(request, timeout=30) as response:  # loopback only
                return response.status, list(response.getheaders()), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, list(exc.headers.items()), exc.read()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ec2_proxy(aws_env: AwsEnv) -> Iterator[Ec2Proxy]:
    """An :class:`Ec2Proxy` in front of this test's moto."""
    proxy = Ec2Proxy(aws_env.url)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
