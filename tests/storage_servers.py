"""Real servers for the storage tests and benchmarks, each a subprocess on 127.0.0.1.

- :func:`start_http_server`: Python's ``http.server`` serving a directory (no Range
  support, so stores must cut ranges out of whole answers themselves).
- :func:`start_fault_server`: this file run as a script; a small HTTP/S3 look-alike
  whose first path segment picks a misbehaviour (see :class:`FaultHandler`), and which
  counts the requests it saw so tests can check retries happened or did not.
- :func:`start_moto_auth_server`: moto's S3 server with IAM authentication on, which
  checks SigV4 signatures and answers 403 to wrong credentials.
- :class:`CredentialServer`: the container-credentials and EC2 instance-metadata
  endpoints, in a thread of the test process, handing out given keys.
- :func:`start_nginx`: nginx (Debian's nginx-light) as our own process with a generated
  configuration, serving a directory; path-style ``/bucket/key`` are plain files.

Every other server is a :class:`ServerProcess`; ``close()`` (or leaving its ``with`` block)
terminates it and waits for it.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

#: Size of every object the fault server serves.
FAULT_OBJECT_SIZE = 300_000


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def object_bytes(name: str, size: int = FAULT_OBJECT_SIZE) -> bytes:
    """Deterministic content for ``name``: what the fault server serves for a path."""
    block = hashlib.sha256(name.encode()).digest() * 64  # 2 KiB
    return (block * (size // len(block) + 1))[:size]


class ServerProcess:
    """A server subprocess listening on 127.0.0.1:``port``; ``url`` is its base URL."""

    def __init__(
        self,
        args: list[str],
        port: int,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        cleanup: str | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._cleanup = cleanup
        # stderr goes to a file, not a pipe: a chatty server (http.server logs every
        # request) would block once a pipe nobody reads is full.
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=env,
            cwd=cwd,
        )
        try:
            self._wait_listening(30.0)
        except BaseException:
            self.close()
            raise

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server {self.proc.args!r} exited with {self.proc.returncode}: "
                    f"{self.log()[-2000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"nothing listened on 127.0.0.1:{self.port} within {timeout}s")

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL), as a crash would."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stop the server and wait for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._cleanup:
            shutil.rmtree(self._cleanup, ignore_errors=True)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Fault server only -------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Requests seen per "METHOD path?query" (fault server)."""
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as r:
            return dict(json.loads(r.read()))

    def reset(self) -> None:
        """Forget the counts and per-path state (fault server)."""
        with urllib.request.urlopen(f"{self.url}/_reset", timeout=10) as r:
            r.read()


def start_http_server(root: Path) -> ServerProcess:
    """Python's threading ``http.server`` serving ``root`` (this file as a script).

    Not ``python -m http.server``: its listen backlog of 5 drops connection attempts
    beyond that, and the kernel then retries them only after a second.
    """
    port = free_port()
    return ServerProcess(
        [sys.executable, os.path.abspath(__file__), "static", str(port), str(root)], port
    )


def start_fault_server(tls: tuple[Path, Path] | None = None) -> ServerProcess:
    """The fault-injecting server (this file as a script); over https with ``tls``.

    ``tls`` is (certificate, private key), PEM files, e.g. from
    :func:`make_self_signed_cert`.
    """
    port = free_port()
    args = [sys.executable, os.path.abspath(__file__), "fault", str(port)]
    if tls is not None:
        args += [str(tls[0]), str(tls[1])]
    server = ServerProcess(args, port)
    if tls is not None:
        server.url = f"https://127.0.0.1:{port}"
    return server


def make_self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost; returns (cert, key) paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dask-ddp test server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class AuthServer(NamedTuple):
    """A signature-checking moto server and credentials it accepts."""

    server: ServerProcess
    key: str  # an IAM user's access key id ...
    secret: str  # ... and secret
    session: tuple[str, str, str]  # temporary (key, secret, session token) of a role


def start_moto_auth_server() -> AuthServer:
    """moto's S3 server with authentication on, and credentials it accepts.

    The first three requests are allowed unauthenticated: they create an IAM user with
    an allow-all policy and its access key. After that every request's SigV4 signature
    is checked (and a temporary key's session token): with the user's key, a role is
    created and assumed for temporary credentials.
    """
    import boto3

    port = free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    server = ServerProcess(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, env=env
    )
    try:
        iam = boto3.client(
            "iam",
            endpoint_url=server.url,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="tester")
        policy = json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
            }
        )
        iam.put_user_policy(UserName="tester", PolicyName="all", PolicyDocument=policy)
        key = iam.create_access_key(UserName="tester")["AccessKey"]
        signed = {
            "endpoint_url": server.url,
            "region_name": "us-east-1",
            "aws_access_key_id": key["AccessKeyId"],
            "aws_secret_access_key": key["SecretAccessKey"],
        }
        iam = boto3.client("iam", **signed)
        trust = json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}
                ],
            }
        )
        role = iam.create_role(RoleName="trainer", AssumeRolePolicyDocument=trust)["Role"]
        iam.put_role_policy(RoleName="trainer", PolicyName="all", PolicyDocument=policy)
        creds = boto3.client("sts", **signed).assume_role(
            RoleArn=role["Arn"], RoleSessionName="test"
        )["Credentials"]
    except BaseException:
        server.close()
        raise
    session = (
        str(creds["AccessKeyId"]),
        str(creds["SecretAccessKey"]),
        str(creds["SessionToken"]),
    )
    return AuthServer(server, str(key["AccessKeyId"]), str(key["SecretAccessKey"]), session)


def start_nginx(root: Path, *, workers: int = 1, access_log: Path | None = None) -> ServerProcess:
    """nginx serving ``root`` as static files, run as our own (non-daemon) process.

    ``access_log``: a file to log each request to, one line each (default: none).
    """
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        raise FileNotFoundError("nginx is not installed (Debian package nginx-light)")
    port = free_port()
    conf_dir = tempfile.mkdtemp(prefix="ddp-nginx-")
    user = "user root;" if os.geteuid() == 0 else ""  # workers must read root's temp files
    conf = f"""
{user}
worker_processes {workers};
daemon off;
master_process on;
pid {conf_dir}/nginx.pid;
error_log {conf_dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log {access_log or "off"};
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  default_type application/octet-stream;
  client_body_temp_path {conf_dir}/body;
  proxy_temp_path {conf_dir}/proxy;
  fastcgi_temp_path {conf_dir}/fastcgi;
  uwsgi_temp_path {conf_dir}/uwsgi;
  scgi_temp_path {conf_dir}/scgi;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    root {root};
    location / {{ }}
  }}
}}
"""
    conf_path = Path(conf_dir) / "nginx.conf"
    conf_path.write_text(conf)
    return ServerProcess(
        [nginx, "-c", str(conf_path), "-p", conf_dir, "-e", "stderr"], port, cleanup=conf_dir
    )


# ---- credential endpoints (in the test's own process) -----------------------------------


class CredentialServer:
    """The AWS credential endpoints of containers and EC2, on 127.0.0.1, in a thread.

    Serves what ECS / EKS Pod Identity agents and the EC2 instance metadata service
    serve, in their documented shapes:

    - ``GET /container/credentials``: ``{"AccessKeyId", "SecretAccessKey", "Token",
      "Expiration", "RoleArn"}``; with ``auth_token`` set, the ``Authorization`` header
      must equal it, else 401 with ``{"code", "message"}``.
    - IMDSv2: ``PUT /latest/api/token`` (with ``X-aws-ec2-metadata-token-ttl-seconds``)
      gives a session token; ``GET /latest/meta-data/iam/security-credentials/`` the role
      name and ``.../<role>`` the credentials (``Code: Success``, ...). Both GETs answer
      401 without a valid ``X-aws-ec2-metadata-token`` header, as IMDSv2 does.

    ``keys`` (access key, secret, session token or None) and ``lifetime`` (seconds until
    the ``Expiration`` handed out) may be changed while it runs; ``count(path)`` tells
    how many requests a "METHOD path" got.
    """

    def __init__(
        self,
        keys: tuple[str, str, str | None],
        *,
        lifetime: float = 3600.0,
        auth_token: str | None = None,
        role: str = "trainer",
    ) -> None:
        self.keys = keys
        self.lifetime = lifetime
        self.auth_token = auth_token
        self.role = role
        self._counts: dict[str, int] = {}
        self._imds_tokens: set[str] = set()
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            # One request per connection: once closed, the server is really gone (a
            # kept-alive connection would go on being served by its thread).
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                owner._handle(self)

            def do_PUT(self) -> None:  # noqa: N802
                owner._handle(self)

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="credential-server", daemon=True
        )
        self._thread.start()

    def count(self, key: str) -> int:
        """Requests seen for ``"METHOD path"``."""
        with self._lock:
            return self._counts.get(key, 0)

    def close(self) -> None:
        """Stop serving and wait for the server thread."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> CredentialServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _credentials(self) -> dict[str, str]:
        key, secret, token = self.keys
        expiry = time.gmtime(time.time() + self.lifetime)
        doc = {
            "AccessKeyId": key,
            "SecretAccessKey": secret,
            "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", expiry),
        }
        if token is not None:
            doc["Token"] = token
        return doc

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        with self._lock:
            k = f"{h.command} {h.path}"
            self._counts[k] = self._counts.get(k, 0) + 1
        n = int(h.headers.get("Content-Length") or 0)
        if n:
            h.rfile.read(n)
        creds_path = "/latest/meta-data/iam/security-credentials/"
        if h.command == "GET" and h.path == "/container/credentials":
            if self.auth_token is not None and h.headers.get("Authorization") != self.auth_token:
                self._send(h, 401, {"code": "Unauthorized", "message": "bad authorization token"})
                return
            doc = self._credentials()
            doc["RoleArn"] = f"arn:aws:iam::123456789012:role/{self.role}"
            self._send(h, 200, doc)
        elif h.command == "PUT" and h.path == "/latest/api/token":
            if not h.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                self._send(h, 400, b"missing X-aws-ec2-metadata-token-ttl-seconds")
                return
            token = os.urandom(16).hex()
            with self._lock:
                self._imds_tokens.add(token)
            self._send(h, 200, token.encode())
        elif h.command == "GET" and h.path.startswith(creds_path):
            with self._lock:
                valid = h.headers.get("X-aws-ec2-metadata-token") in self._imds_tokens
            if not valid:
                self._send(h, 401, b"")
            elif h.path == creds_path:
                self._send(h, 200, f"{self.role}\n".encode())
            elif h.path == creds_path + self.role:
                doc = dict(Code="Success", Type="AWS-HMAC", LastUpdated="2026-01-01T00:00:00Z")
                doc.update(self._credentials())
                self._send(h, 200, doc)
            else:
                self._send(h, 404, b"")
        else:
            self._send(h, 404, b"")

    @staticmethod
    def _send(
        h: http.server.BaseHTTPRequestHandler, status: int, body: bytes | dict[str, str]
    ) -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        h.send_response(status)
        h.send_header("Content-Length", str(len(data)))
        if isinstance(body, dict):
            h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(data)


# ---- the fault server (runs in its own process) ----------------------------------------


def _error_xml(code: str, message: str, key: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>{message}</Message><Key>{key}</Key></Error>"
    ).encode()


class FaultHandler(http.server.BaseHTTPRequestHandler):
    """Serves ``object_bytes(path)`` for any path, misbehaving by its first segment.

    - ``/ok/...``: always answers.
    - ``/slowdown-N/...``: the first N requests per path get ``503 SlowDown``.
    - ``/drop-N/...``: the first N GETs per path announce the whole body, send half of
      it and close the connection.
    - ``/drop-always/...``: every GET is cut short that way.
    - ``/status-NNN/...``: always answers HTTP NNN with an S3-style XML error body.
    - ``/reqtimeout-N/...``: the first N requests per path get ``400 RequestTimeout``, as
      S3 answers a request whose body stalled (retryable despite the 400).
    - ``/expired-N/...``: the first N requests per path get ``400 ExpiredToken``.
    - ``/skewed/...``: always ``403 RequestTimeTooSkewed`` (never worth a retry).
    - ``/stall-N/...``: the first N GETs per path send the headers and half the body,
      then go silent for 5 s (a stalled connection the client must time out).
    - ``/mpu-fail/...``: S3 multipart upload whose part uploads fail with 400.
    - ``/huge-length/...``: GET answers announce ``Content-Length: 17179869183`` (16 GiB
      - 1), send a few bytes and close (a client must refuse before allocating).
    - ``/unsized/...``: GET answers carry no Content-Length; the body (the usual
      object bytes) runs to the connection's close.
    - ``/list-loop/``, ``/list-notoken/``: a ListObjectsV2 that never ends (the same
      continuation token on every page, or none though the page is truncated).
    - ``/_stats``: JSON of request counts per ``"METHOD path"``; ``/_reset`` clears them.
    """

    protocol_version = "HTTP/1.1"
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # quiet: the counts are the record

    def _count(self) -> int:
        with self.lock:
            k = f"{self.command} {self.path}"
            self.counts[k] = self.counts.get(k, 0) + 1
            # Per-path count across methods and queries, for the "first N" modes.
            p = f"path {self.path.split('?')[0]}"
            self.counts[p] = self.counts.get(p, 0) + 1
            return self.counts[p]

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _drain_body(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        while n > 0:
            chunk = self.rfile.read(min(n, 1 << 20))
            if not chunk:
                break
            n -= len(chunk)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._handle()

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle()

    def do_PUT(self) -> None:  # noqa: N802
        self._drain_body()
        self._handle()

    def do_POST(self) -> None:  # noqa: N802
        self._drain_body()
        self._handle()

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle()

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/_stats":
            self._send(200, json.dumps(self.counts).encode())
            return
        if path == "/_reset":
            with self.lock:
                self.counts.clear()
            self._send(200, b"")
            return
        n = self._count()
        mode = path.lstrip("/").split("/", 1)[0]
        body = object_bytes(path)
        if mode.startswith("slowdown-") and n <= int(mode.split("-")[1]):
            self._send(503, _error_xml("SlowDown", "Please reduce your request rate.", path))
            return
        if mode.startswith("reqtimeout-") and n <= int(mode.split("-")[1]):
            msg = "Your socket connection to the server was not read from or written to"
            self._send(400, _error_xml("RequestTimeout", msg, path))
            return
        if mode.startswith("expired-") and n <= int(mode.split("-")[1]):
            self._send(400, _error_xml("ExpiredToken", "The provided token has expired.", path))
            return
        if mode == "skewed":
            msg = "The difference between the request time and the current time is too large."
            self._send(403, _error_xml("RequestTimeTooSkewed", msg, path))
            return
        if mode.startswith("stall-") and n <= int(mode.split("-")[1]) and self.command == "GET":
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(5)
            self.close_connection = True
            return
        if mode.startswith("status-"):
            status = int(mode.split("-")[1])
            code = {403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError"}.get(
                status, "Error"
            )
            self._send(status, _error_xml(code, f"injected {status}", path))
            return
        if mode == "mpu-fail":
            if self.command == "POST" and "uploads" in query:
                self._send(
                    200,
                    b"<InitiateMultipartUploadResult><UploadId>up-1</UploadId>"
                    b"</InitiateMultipartUploadResult>",
                )
            elif self.command == "PUT" and "partNumber" in query:
                self._send(400, _error_xml("InvalidRequest", "injected part failure", path))
            elif self.command == "DELETE":
                self._send(204, b"")
            else:
                self._send(400, _error_xml("InvalidRequest", "unexpected", path))
            return
        if mode.startswith("list-") and self.command == "GET" and "list-type=2" in query:
            # A ListObjectsV2 that never ends: each page says "truncated" and names the
            # same continuation token (list-loop), or none at all (list-notoken).
            token = ("" if mode == "list-notoken"
                     else "<NextContinuationToken>again</NextContinuationToken>")
            n_key = f"<Contents><Key>k{n}</Key><Size>1</Size></Contents>"
            self._send(200, (f"<ListBucketResult><IsTruncated>true</IsTruncated>{n_key}"
                             f"{token}</ListBucketResult>").encode())
            return
        if mode == "huge-length" and self.command == "GET":
            self.send_response(200)
            self.send_header("Content-Length", str((16 << 30) - 1))
            self.end_headers()
            self.wfile.write(body[:1000])
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "unsized" and self.command == "GET":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            return
        drop = mode == "drop-always" or (
            mode.startswith("drop-") and mode != "drop-always" and n <= int(mode.split("-")[1])
        )
        if drop and self.command == "GET":
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.command in ("PUT", "DELETE"):
            self._send(200 if self.command == "PUT" else 204, b"", {"ETag": '"etag"'})
            return
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and self.command == "GET":
            first_s, _, last_s = rng[6:].partition("-")
            first = int(first_s)
            last = min(int(last_s), len(body) - 1) if last_s else len(body) - 1
            if first >= len(body):
                self._send(416, b"", {"Content-Range": f"bytes */{len(body)}"})
                return
            self._send(
                206, body[first : last + 1], {"Content-Range": f"bytes {first}-{last}/{len(body)}"}
            )
            return
        self._send(200, body)


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 1024  # the default (5) drops bursts of connection attempts
    daemon_threads = True


class _StaticHandler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep connections alive, as real servers do

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def _serve(server: http.server.HTTPServer) -> None:
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) in (3, 5) and sys.argv[1] == "fault":
        fault = _Server(("127.0.0.1", int(sys.argv[2])), FaultHandler)
        if len(sys.argv) == 5:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(sys.argv[3], sys.argv[4])
            fault.socket = ctx.wrap_socket(fault.socket, server_side=True)
        _serve(fault)
    elif len(sys.argv) == 4 and sys.argv[1] == "static":
        root = sys.argv[3]

        class _Handler(_StaticHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=root, **kwargs)

        _serve(_Server(("127.0.0.1", int(sys.argv[2])), _Handler))
    else:
        sys.exit(f"usage: {sys.argv[0]} fault PORT [CERT KEY] | static PORT ROOT")


class FlakyProxy:
    """A reverse proxy in a thread of the test process, in front of a real server (e.g.
    moto), that answers ``503 SlowDown`` instead of forwarding while ``fail(method, path)``
    is true; every other request goes through unchanged. ``failed`` counts the 503s.

    For tests where one object of a real store is transiently unavailable while listing
    and the other objects work.
    """

    def __init__(self, upstream: str, fail: Any) -> None:
        import http.client
        import urllib.parse

        up = urllib.parse.urlsplit(upstream)
        self.failed = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if fail(self.command, self.path.split("?")[0]):
                    proxy.failed += 1
                    err = _error_xml("SlowDown", "Please reduce your request rate.", self.path)
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                conn = http.client.HTTPConnection(up.hostname or "", up.port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                    r = conn.getresponse()
                    data = r.read()
                finally:
                    conn.close()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FlakyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
