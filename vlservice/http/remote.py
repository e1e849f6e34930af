"""Remote image URLs, off by default; when `VL_REMOTE_IMAGES` lists hosts, fetched safely.

A server that fetches any URL it is given is a proxy into its own network (SSRF). So: https only,
the host must be exactly one of the allowlisted names, every address it resolves to must be a
global one (never loopback, link-local, private, multicast or reserved), the connection goes to
the address we checked (no second DNS lookup an attacker could rebind), TLS is verified against
the host name, redirects are not followed, and the body is cut at the byte limit while reading.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from urllib.parse import urlsplit

from ..errors import ImageTooLarge, InvalidRequest, brief


def is_public(address: str) -> bool:
    """A global address: never loopback, link-local, private, multicast or reserved."""
    return ipaddress.ip_address(address.split("%")[0]).is_global


class RemoteFetcher:
    """The server builds it from settings alone. `resolver`, `context` (the trusted CAs) and
    `address_allowed` exist so a test can fetch from its own HTTPS server on loopback; the defaults
    (system DNS, the system's CAs, global addresses only) are the only ones production uses."""

    def __init__(self, settings, resolver=socket.getaddrinfo, context: ssl.SSLContext | None = None,
                 address_allowed=is_public):
        self.hosts = {h.strip().lower() for h in settings.remote_images.split(",") if h.strip()}
        self.timeout = settings.remote_image_timeout_s
        self.max_bytes = settings.max_image_bytes
        self.resolver = resolver
        self.context = context or ssl.create_default_context()
        self.address_allowed = address_allowed

    def __call__(self, url: str, param: str, max_bytes: int | None = None) -> bytes:
        """The body at `url`, at most `max_bytes` (default VL_MAX_IMAGE_BYTES; a video passes its own)."""
        max_bytes = self.max_bytes if max_bytes is None else max_bytes
        parts = urlsplit(url)
        if parts.scheme != "https":
            raise InvalidRequest("only https image URLs are allowed", param=param, code="invalid_image_url")
        host = (parts.hostname or "").lower()
        if host not in self.hosts:
            raise InvalidRequest(f"image host {brief(host)} is not in the allowlist", param=param,
                                 code="image_host_not_allowed")
        port = parts.port or 443
        address = self._checked_address(host, port, param)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = _PinnedHTTPSConnection(host, port, address, timeout=self.timeout, context=self.context)
        try:
            conn.request("GET", path, headers={"Host": host, "User-Agent": "vlservice", "Accept": "image/*, video/*"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise InvalidRequest(f"fetching the image failed: HTTP {resp.status} (redirects are not followed)",
                                     param=param, code="image_fetch_failed")
            data = resp.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise ImageTooLarge(f"the remote file is larger than {max_bytes} bytes", param=param)
            return data
        except (OSError, http.client.HTTPException) as exc:
            raise InvalidRequest(f"fetching the image failed: {type(exc).__name__}", param=param,
                                 code="image_fetch_failed") from None
        finally:
            conn.close()

    def _checked_address(self, host: str, port: int, param: str) -> str:
        try:
            infos = self.resolver(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise InvalidRequest(f"image host {brief(host)} does not resolve", param=param,
                                 code="image_fetch_failed") from None
        addresses = [info[4][0] for info in infos]
        if not addresses:
            raise InvalidRequest(f"image host {brief(host)} does not resolve", param=param, code="image_fetch_failed")
        for a in addresses:
            if not self.address_allowed(a):
                raise InvalidRequest(f"image host {brief(host)} resolves to a non-public address", param=param,
                                     code="image_host_not_allowed")
        return addresses[0]


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a fixed IP address, with SNI and certificate checks for the host name."""

    def __init__(self, host, port, address, timeout, context):
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address
        self._ctx = context

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._ctx.wrap_socket(sock, server_hostname=self.host)
