"""A client for one OCI registry on oras-py (blobs, Basic/Bearer auth). Credentials, timeouts without
retry sleeps, exact manifest bytes and the loopback plain-HTTP fallback are ours: oras lacks them."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import oras.auth
import oras.auth.utils
import oras.provider
import requests

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.files import write_atomic
from builder.oci.manifest import (
    DIGEST_HEADER,
    MANIFEST_ACCEPT,
    MAX_MANIFEST_BYTES,
    MT_OCI_MANIFEST,
    Descriptor,
    media_type_of,
    sha256_digest,
)
from builder.oci.reference import DIGEST, split_host

# oras logs through Python's last-resort handler, i.e. to stderr; envbuild reports each
# failure itself, in one line.
logging.getLogger("oras.logger").addHandler(logging.NullHandler())
logging.getLogger("oras.logger").propagate = False

#: Largest blob read by default (a certificate statement is a few hundred KiB).
MAX_BLOB_BYTES = 64 << 20


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """Credentials of the Docker config ``source``, in memory only (``username`` empty: none for the registry)."""

    username: str
    password: str = field(repr=False)
    source: str = ""

    def engine_auth(self) -> dict[str, str]:
        """The ``auth_config`` the docker SDK hands to the engine."""
        return {"username": self.username, "password": self.password}


class AuthFailed(Unreachable):
    """The registry refused the credentials, or asked for some the Docker config lacks (exit 3)."""


def is_loopback(host: str) -> bool:
    """Whether ``host[:port]`` is this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    import ipaddress

    name = split_host(host)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


_REASONS = (("Connection refused", "connection refused"), ("Name or service not known", "name does not resolve"),
            ("Temporary failure in name resolution", "name does not resolve"), ("timed out", "no answer (timeout)"),
            ("Connection reset", "connection reset"), ("RemoteDisconnected", "connection closed by the registry"),
            ("WRONG_VERSION_NUMBER", "not a TLS server (plain HTTP?)"),
            ("wrong version number", "not a TLS server (plain HTTP?)"),
            ("CERTIFICATE_VERIFY_FAILED", "certificate not trusted"))


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for needle, short in _REASONS:
        if needle in text:
            return short
    return " ".join(text.split())[:160]


# --------------------------------------------------------------------------- transport


class _Session(requests.Session):
    """Every request with a timeout: oras' token requests set none."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self.timeout_s = timeout_s

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout_s)
        return super().request(method, url, *args, **kwargs)


class _Oras(oras.provider.Registry):
    """oras' client; only its transport is envbuild's (:meth:`RegistryClient.request`: one try, timeouts)."""

    def __init__(self, owner: RegistryClient) -> None:
        super().__init__(hostname=owner.host, insecure=True, tls_verify=owner.verify, auth_backend="basic")
        self.session = owner.session
        self._owner = owner

    def do_request(self, url: str, method: str = "GET", data: Any = None, headers: dict[str, str] | None = None,
                   json: Any = None, stream: bool = False) -> requests.Response:
        return self._owner.request(method, url, data=data, headers=headers, json=json, stream=stream)


def read_bounded(r: requests.Response, limit: int, what: str) -> bytes:
    """A streamed response's body, refused past ``limit`` bytes. Raises EnvbuildError (exit 2)."""
    declared = r.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > limit:
        r.close()
        raise EnvbuildError(f"{what} is {declared} bytes, over the {limit}-byte limit")
    chunks, total = [], 0
    for chunk in r.iter_content(1 << 16):
        total += len(chunk)
        if total > limit:
            r.close()
            raise EnvbuildError(f"{what} is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


class RegistryClient:

    def __init__(self, host: str, *, plain_http: bool | None = None, ca_cert: str | os.PathLike[str] | None = None,
                 timeout_s: float = 30.0, credentials: Credentials | None = None) -> None:
        self.host = host
        self.timeout_s = timeout_s
        certs_d = Path("/etc/docker/certs.d") / host / "ca.crt"
        self.verify: bool | str = str(ca_cert) if ca_cert else (str(certs_d) if certs_d.is_file() else True)
        self.credentials = credentials if credentials and credentials.username else None
        self._config = credentials.source if credentials else "the Docker config"
        if plain_http:
            self._schemes = ["http"]
        elif plain_http is None and is_loopback(host):
            self._schemes = ["https", "http"]
        else:
            self._schemes = ["https"]
        self.scheme = self._schemes[0]
        self.session = _Session(timeout_s)
        self._auth_header: dict[str, str] = {}
        self._oras = _Oras(self)
        self._pinged = False

    # -- transport

    def request(self, method: str, url: str, *, data: Any = None, headers: dict[str, str] | None = None,
                json: Any = None, stream: bool = False, params: dict[str, str] | None = None) -> requests.Response:
        """One request, authenticated as ``WWW-Authenticate`` asks, one retry after a 401; Unreachable (3)."""
        hdrs = dict(headers or {})
        hdrs.update(self._auth_header)
        kw: dict[str, Any] = dict(data=data, json=json, stream=stream, params=params, verify=self.verify,
                                  timeout=self.timeout_s)
        try:
            r = self.session.request(method, url, headers=hdrs, **kw)
            if r.status_code == 401:
                self._authenticate(r)
                hdrs.update(self._auth_header)
                r = self.session.request(method, url, headers=hdrs, **kw)
                if r.status_code == 401:
                    raise self._auth_error()
        except requests.exceptions.SSLError as e:
            raise Unreachable(f"registry {self.host}: TLS failed at {url}: {_reason(e)}; give its CA with "
                              "--registry-ca, or --plain-http for a plain-HTTP registry") from None
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as e:
            raise Unreachable(f"registry {self.host} unreachable: {_reason(e)} ({url})") from None
        return r

    def _auth_error(self) -> AuthFailed:
        if self.credentials:
            return AuthFailed(f"registry {self.host} refused the credentials of user "
                              f"{self.credentials.username!r} from {self.credentials.source}; run "
                              f"`docker login {self.host}`")
        return AuthFailed(f"registry {self.host} asks for credentials and {self._config} has none "
                          f"for it; run `docker login {self.host}`")

    def _authenticate(self, resp: requests.Response) -> None:
        """Answer a 401 with oras' auth backend (basic, bearer, anonymous without credentials); header kept."""
        challenge = resp.headers.get("WWW-Authenticate", "")
        scheme = challenge.strip().partition(" ")[0].lower()
        creds = self.credentials
        if scheme == "basic" and creds:
            name, refresh = "basic", False
        elif scheme == "bearer" and oras.auth.utils.parse_auth_header(challenge).realm:
            name, refresh = "token", True
        else:
            raise self._auth_error()
        backend = oras.auth.get_auth_backend(name, self.session, insecure=self.scheme == "http", tls_verify=self.verify)
        if creds:
            backend.set_basic_auth(creds.username, creds.password)
        try:
            got, ok = backend.authenticate_request(resp, {}, refresh=refresh)
        except ValueError:  # a token answer that is not JSON
            ok, got = False, {}
        if not ok or not got.get("Authorization"):
            raise self._auth_error()
        self._auth_header = {"Authorization": got["Authorization"]}

    def url(self, repository: str, kind: str, ref: str = "") -> str:
        """``<scheme>://<host>/v2/<repository>/<kind>/<ref>``."""
        return f"{self.scheme}://{self.host}/v2/{repository}/{kind}/{ref}"

    def fail(self, r: requests.Response, what: str) -> EnvbuildError:
        """The one-line error of an answer: exit 3 for server errors, refused access, else 2; registry errors added."""
        detail = ""
        try:
            errs = r.json().get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errs if isinstance(e, dict))
        except (ValueError, AttributeError):
            detail = " ".join(r.text.split())[:160]
        code = ExitCode.UNREACHABLE if r.status_code >= 500 or r.status_code in (401, 403) else ExitCode.CHECK_FAILED
        return EnvbuildError(f"registry {self.host}: {what} answered HTTP {r.status_code}"
                             + (f" ({' '.join(detail.split())[:300]})" if detail else ""), exit_code=code)

    # -- API

    def ping(self) -> None:
        """``GET /v2/``; picks HTTPS or plain HTTP. Raises Unreachable (exit 3)."""
        last: Exception | None = None
        for scheme in self._schemes:
            self.scheme = scheme
            url = f"{scheme}://{self.host}/v2/"
            try:
                r = self.request("GET", url)
            except AuthFailed:
                raise
            except Unreachable as e:
                last = e
                continue
            if r.status_code == 200:
                self._oras.prefix = scheme
                self._pinged = True
                return
            raise Unreachable(f"registry {self.host}: {url} answered HTTP {r.status_code}; is it an OCI "
                              "distribution registry?")
        assert last is not None
        raise last

    def ensure(self) -> None:
        if not self._pinged:
            self.ping()

    def head_manifest(self, repository: str, ref: str) -> Descriptor | None:
        """The descriptor of manifest ``ref`` (tag or digest), or None when absent (404)."""
        self.ensure()
        r = self.request("HEAD", self.url(repository, "manifests", ref), headers={"Accept": MANIFEST_ACCEPT})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self.fail(r, f"HEAD manifest {repository}:{ref}")
        digest = r.headers.get(DIGEST_HEADER)
        if not digest or not DIGEST.fullmatch(digest):
            got = self.get_manifest(repository, ref)
            return got[1] if got else None
        length = r.headers.get("Content-Length") or "0"
        return Descriptor(r.headers.get("Content-Type", MT_OCI_MANIFEST).split(";")[0], digest,
                          int(length) if length.isdigit() else 0)

    def get_manifest(self, repository: str, ref: str) -> tuple[bytes, Descriptor] | None:
        """``(manifest bytes, descriptor)`` of ``ref``, None on 404; EnvbuildError (2): over 4 MiB, wrong digest."""
        self.ensure()
        r = self.request("GET", self.url(repository, "manifests", ref), headers={"Accept": MANIFEST_ACCEPT},
                         stream=True)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self.fail(r, f"GET manifest {repository}:{ref}")
        body = read_bounded(r, MAX_MANIFEST_BYTES, f"registry {self.host}: manifest {repository}:{ref}")
        digest = sha256_digest(body)
        if DIGEST.fullmatch(ref) and digest != ref:
            raise EnvbuildError(f"registry {self.host} served manifest {repository}@{ref} with content "
                                f"{digest}: altered in the registry", field="manifest", value=ref)
        mt = media_type_of(body, r.headers.get("Content-Type", "").split(";")[0])
        return body, Descriptor(mt, digest, len(body))

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> requests.Response:
        """PUT a manifest under ``ref``; returns the response (201). Raises EnvbuildError (exit 2, 3)."""
        self.ensure()
        r = self.request("PUT", self.url(repository, "manifests", ref), data=body, headers={"Content-Type": media_type})
        if r.status_code not in (200, 201):
            raise self.fail(r, f"PUT manifest {repository}:{ref}")
        return r

    def push_blob(self, repository: str, data: bytes, media_type: str = "application/octet-stream") -> Descriptor:
        """Upload a blob (oras: skipped when it exists, else POST then PUT). Returns its descriptor."""
        self.ensure()
        desc = Descriptor(media_type, sha256_digest(data), len(data))
        with tempfile.TemporaryDirectory(prefix="envbuild-blob-") as tmp:
            path = os.path.join(tmp, "blob")
            write_atomic(path, data)
            try:
                r = self._oras.upload_blob(path, self._oras.get_container(f"{self.host}/{repository}"), desc.to_json())
            except ValueError as e:  # oras: no upload session (no Location)
                raise Unreachable(f"registry {self.host}: blob upload to {repository} failed: "
                                  f"{' '.join(str(e).split())[:200]}") from None
        if r.status_code not in (200, 201, 202):
            raise self.fail(r, f"blob upload to {repository}")
        return desc

    def get_blob(self, repository: str, desc: Descriptor, limit: int = MAX_BLOB_BYTES) -> bytes:
        """Fetch a blob (oras), check sha256 and size; EnvbuildError (2): missing, over ``limit``, or altered."""
        self.ensure()
        if desc.size > limit:
            raise EnvbuildError(f"blob of {desc.size} bytes is larger than {limit}", field="blob", value=desc.digest)
        r = self._oras.get_blob(self._oras.get_container(f"{self.host}/{repository}"), desc.digest, stream=True)
        if r.status_code == 404:
            raise EnvbuildError(f"registry {self.host} has no blob {desc.digest} in {repository}",
                                field="blob", value=desc.digest)
        if r.status_code != 200:
            raise self.fail(r, f"GET blob {desc.digest}")
        data = read_bounded(r, limit, f"registry {self.host}: blob {desc.digest}")
        got = sha256_digest(data)
        if got != desc.digest or len(data) != desc.size:
            raise EnvbuildError(f"registry {self.host} served blob {desc.digest} of {repository} with content "
                                f"{got} ({len(data)} bytes, expected {desc.size}): altered in the registry",
                                field="blob", value=desc.digest)
        return data
