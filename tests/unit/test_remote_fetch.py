"""The remote image fetcher against a real HTTPS server on 127.0.0.1 with a self-signed certificate
(made by `openssl req`): an allowlisted host is fetched (pinned to the checked address, verified
against the host name), and the refusals around it hold: loopback under the production address
check, a certificate for another name, a redirect, a body over the byte limit."""

from __future__ import annotations

import http.server
import ipaddress
import socket
import ssl
import subprocess
import threading

import pytest

from vlservice.config import Settings
from vlservice.errors import APIError, ImageTooLarge
from vlservice.http.remote import RemoteFetcher, is_public

HOST = "images.test"  # the name on the certificate; resolved by the test's resolver only
OTHER = "other.test"  # allowlisted, served by the same server, but not on the certificate
IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
LIMIT = 4096


class Handler(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):
        Handler.seen.append((self.path, self.headers.get("Host")))
        if self.path.startswith("/cat.png"):
            self._send(200, IMAGE)
        elif self.path == "/big.png":
            self._send(200, b"\0" * (LIMIT + 1))
        elif self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", f"https://{HOST}/cat.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(404, b"")

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2",
                    "-subj", f"/CN={HOST}", "-addext", f"subjectAltName=DNS:{HOST}"],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.fixture(scope="module")
def https_port(cert):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*map(str, cert))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def fresh_log():
    Handler.seen = []


def loopback_resolver(host, port, type=0, **_):
    """Test DNS: the two test names are this machine."""
    if host not in (HOST, OTHER):
        raise socket.gaierror(host)
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


def fetcher(cert, **kw) -> RemoteFetcher:
    settings = Settings(remote_images=f"{HOST},{OTHER}", remote_image_timeout_s=10, max_image_bytes=LIMIT)
    args = dict(resolver=loopback_resolver, context=ssl.create_default_context(cafile=str(cert[0])),
                address_allowed=lambda a: ipaddress.ip_address(a).is_loopback)
    return RemoteFetcher(settings, **{**args, **kw})


def test_an_allowlisted_host_is_fetched(cert, https_port):
    data = fetcher(cert)(f"https://{HOST}:{https_port}/cat.png?size=small", "image_url")
    assert data == IMAGE
    assert Handler.seen == [("/cat.png?size=small", HOST)]  # the host name, not the address we dialled


def test_the_production_address_check_refuses_loopback_before_connecting(cert, https_port):
    assert RemoteFetcher(Settings()).address_allowed is is_public  # what the server runs with
    assert not any(map(is_public, ["127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "fe80::1%eth0"]))
    strict = fetcher(cert, address_allowed=is_public)
    with pytest.raises(APIError) as exc:
        strict(f"https://{HOST}:{https_port}/cat.png", "image_url")
    assert exc.value.status == 400 and exc.value.code == "image_host_not_allowed"
    assert Handler.seen == []


def test_a_certificate_for_another_name_is_refused(cert, https_port):
    with pytest.raises(APIError) as exc:
        fetcher(cert)(f"https://{OTHER}:{https_port}/cat.png", "image_url")
    assert exc.value.code == "image_fetch_failed"
    assert Handler.seen == []  # the TLS handshake failed: no request was sent


def test_the_system_cas_do_not_trust_a_self_signed_certificate(cert, https_port):
    with pytest.raises(APIError) as exc:
        fetcher(cert, context=None)(f"https://{HOST}:{https_port}/cat.png", "image_url")
    assert exc.value.code == "image_fetch_failed" and Handler.seen == []


def test_redirects_are_not_followed(cert, https_port):
    with pytest.raises(APIError) as exc:
        fetcher(cert)(f"https://{HOST}:{https_port}/moved.png", "image_url")
    assert exc.value.code == "image_fetch_failed" and "302" in exc.value.message
    assert Handler.seen == [("/moved.png", HOST)]


def test_a_body_over_the_limit_is_refused(cert, https_port):
    with pytest.raises(ImageTooLarge) as exc:
        fetcher(cert)(f"https://{HOST}:{https_port}/big.png", "messages[0].content[0].image_url")
    assert exc.value.param == "messages[0].content[0].image_url"
