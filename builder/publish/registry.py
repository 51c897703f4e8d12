"""Publish certified images to a registry by digest, and pull only what is certified.

``envbuild push RECIPE --registry HOST[:PORT]`` (:func:`push`):

1. finds a *passing* certificate for the exact local image (same image ID) under
   ``images/<recipe>/certificates/`` and refuses (exit 2) without one
   (:func:`find_certified`);
2. pushes the image with the Docker engine as ``HOST/<namespace>/<recipe>:<lock hash 12>``
   and records the manifest digest the registry reports; the moving tag ``certified`` is
   then set to that same manifest through the registry API (no second engine push);
3. publishes the certificate as an in-toto statement (:mod:`builder.publish.attest`, optionally a
   signed DSSE envelope) in an **OCI artifact** whose ``subject`` is the image manifest:
   an OCI image manifest with ``artifactType`` ``application/vnd.in-toto+json``, the empty
   config ``application/vnd.oci.empty.v1+json`` and one layer, the statement. A registry
   with the Referrers API answers the manifest PUT with ``OCI-Subject``; otherwise (e.g.
   Debian's docker-registry 2.8) the **referrers tag schema** fallback is used: the image
   index tagged ``sha256-<hex of the image digest>`` lists the artifact (OCI distribution
   spec v1.1, "Pushing Manifests with Subject" and "Referrers Tag Schema");
4. tags the artifact manifest ``<tag>.cert`` next to each image tag, so that a node can
   tell which digest the certificate covers from the tag alone (a tag moved later no
   longer matches it).

``envbuild pull RECIPE|REF --registry HOST`` (:func:`pull`) resolves the tag to a digest,
fetches the certificate (``<tag>.cert``, else the referrers of the digest), verifies the
statement (subject = that digest, a passing verdict, the signature when a public key is
configured), checks this node (driver floor, GPU models; :func:`check_hardware`), pulls
the image **by digest** and checks that the pulled image ID and labels are the certified
ones before tagging it. A refused pull removes what it pulled: no half-tagged image.

Credentials come from the Docker config the user already has (``$DOCKER_CONFIG/config.json``
or ``~/.docker/config.json``, including credential helpers, read through the docker SDK);
they are handed in memory to the engine and to the HTTP client, never written anywhere.

Sources: OCI distribution spec v1.1 (manifests, blobs, referrers, tag schema fallback), OCI
image spec v1.1 (manifest ``subject``/``artifactType``, empty descriptor), Docker registry
token authentication (``WWW-Authenticate: Bearer realm=...,service=...,scope=...``).
The OCI protocol calls (blob upload, manifest and blob fetches) go through the ``oras``
library (``oras.provider.Registry``); envbuild supplies authentication and error handling.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import docker
import docker.auth
import docker.errors
import docker.utils.config
import oras.provider
import requests
from packaging.version import InvalidVersion, Version

from builder.publish import attest
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.paths import image_dir

MT_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MT_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
#: The OCI empty descriptor (image spec v1.1, "Guidance for an Empty Descriptor").
MT_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
MANIFEST_ACCEPT = ", ".join((MT_OCI_MANIFEST, MT_OCI_INDEX, MT_DOCKER_MANIFEST, MT_DOCKER_LIST))

#: artifactType of the certificate artifact.
ARTIFACT_TYPE = attest.MEDIA_TYPE_STATEMENT
ANN_PREDICATE = "in-toto.io/predicate-type"
ANN_CREATED = "org.opencontainers.image.created"
ANN_RECIPE = "dev.envbuild.recipe"
ANN_LOCK = "dev.envbuild.lock-hash"
ANN_VERDICT = "dev.envbuild.verdict"

DEFAULT_NAMESPACE = "envbuild"
CERTIFIED_TAG = "certified"
#: Suffix of the tag naming the certificate artifact of an image tag (``certified.cert``).
CERT_TAG_SUFFIX = ".cert"

_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: A registry ``host[:port]``: DNS labels or a bracketed IPv6 address; matched whole.
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[0-9A-Fa-f:.]{{2,45}}\])(?::([0-9]{{1,5}}))?")
#: Longest image reference accepted (characters).
MAX_REF_CHARS = 1000


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class ImageRef:
    """An image reference ``host/repository[:tag][@sha256:digest]``.

    Attributes:
        host: registry ``host[:port]``, e.g. ``"127.0.0.1:5000"``.
        repository: path in the registry, e.g. ``"envbuild/cpu-torch2"``.
        tag: e.g. ``"certified"``, or None.
        digest: ``"sha256:<64 hex>"``, or None.
    """

    host: str
    repository: str
    tag: Optional[str] = None
    digest: Optional[str] = None

    @property
    def name(self) -> str:
        """``host/repository``."""
        return f"{self.host}/{self.repository}"

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def _usage(message: str, value: object) -> EnvbuildError:
    return EnvbuildError(message, field="reference", value=value, exit_code=ExitCode.USAGE)


def parse_ref(text: str, default_host: str | None = None) -> ImageRef:
    """Parse ``[host[:port]/]repo/path[:tag][@sha256:hex]``.

    The first path component is a host when it contains ``.`` or ``:`` or is
    ``localhost`` (Docker's rule); otherwise ``default_host`` is used.

    Raises:
        EnvbuildError: (exit 64) malformed, or no host and no ``default_host``.
    """
    if not isinstance(text, str) or len(text) > MAX_REF_CHARS:
        raise _usage(f"is not an image reference (at most {MAX_REF_CHARS} characters)", text)
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _SHA256.fullmatch(digest):
            raise _usage("digest is not sha256:<64 hex>", text)
    host = None
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        host, rest = first, remainder
    tag = None
    repo, sep, maybe_tag = rest.rpartition(":")
    if sep and "/" not in maybe_tag:
        rest, tag = repo, maybe_tag
        if not _TAG.fullmatch(tag):
            raise _usage("tag is not a valid tag", text)
    if not _REPO.fullmatch(rest):
        raise _usage("is not an image reference (host/repository[:tag][@sha256:digest])", text)
    host = host or default_host
    if not host:
        raise _usage("names no registry; give --registry HOST[:PORT]", text)
    m = _HOST.fullmatch(host)
    if not m or (m.group(1) is not None and not 1 <= int(m.group(1)) <= 65535):
        raise _usage("registry is not HOST[:PORT] (a port in 1..65535)", text)
    return ImageRef(host=host, repository=rest, tag=tag, digest=digest)


def parse_target(target: str, registry: str | None, namespace: str = DEFAULT_NAMESPACE) -> ImageRef:
    """What ``envbuild pull`` should fetch: a recipe name (``cpu-torch2`` ->
    ``REGISTRY/<namespace>/cpu-torch2:certified``) or an image reference.

    Raises:
        EnvbuildError: (exit 64) malformed, or no registry known.
    """
    if not isinstance(target, str) or len(target) > MAX_REF_CHARS:
        raise _usage(f"is not a recipe name or image reference (at most {MAX_REF_CHARS} characters)", target)
    if re.fullmatch(_COMPONENT, target):
        if not registry:
            raise _usage("a recipe name needs --registry HOST[:PORT]", target)
        return ImageRef(host=registry, repository=f"{namespace}/{target}", tag=CERTIFIED_TAG)
    ref = parse_ref(target, registry)
    if ref.tag is None and ref.digest is None:
        ref = ImageRef(ref.host, ref.repository, CERTIFIED_TAG, None)
    return ref


def sha256_digest(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether ``host[:port]`` is this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    name = host
    if name.startswith("["):
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """Registry credentials found in the user's Docker config (kept in memory only)."""

    username: str
    password: str = field(repr=False)
    source: str = ""

    def engine_auth(self) -> dict[str, str]:
        """The ``auth_config`` the docker SDK hands to the engine."""
        return {"username": self.username, "password": self.password}


def docker_config_path() -> str:
    """The Docker config file the docker CLI would read (``$DOCKER_CONFIG/config.json`` or
    ``~/.docker/config.json``), as a display string even when it does not exist."""
    found = docker.utils.config.find_config_file()
    if found:
        return found
    base = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(base, "config.json")


def docker_credentials(host: str) -> Credentials | None:
    """Credentials for ``host`` from the Docker config (``auths``, ``credHelpers``,
    ``credsStore``), read with the docker SDK at call time; None when it has none.

    Raises:
        EnvbuildError: (exit 3) the config exists but cannot be read or parsed.
    """
    path = docker.utils.config.find_config_file()
    if not path:
        return None
    try:
        cfg = docker.auth.load_config(path)
        found = cfg.resolve_authconfig(host)
    except Exception as e:  # noqa: BLE001 - the SDK raises several types here
        raise EnvbuildError(f"cannot read registry credentials: {e}", file=path, exit_code=ExitCode.UNREACHABLE) from None
    if not found:
        return None
    user = found.get("username") or found.get("Username")
    password = found.get("password") or found.get("Password")
    if not user or password is None:
        return None
    return Credentials(username=user, password=password, source=path)


class AuthFailed(Unreachable):
    """The registry refused the credentials, or asked for some the Docker config lacks (exit 3)."""


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for needle, short in (
        ("Connection refused", "connection refused"),
        ("Name or service not known", "name does not resolve"),
        ("Temporary failure in name resolution", "name does not resolve"),
        ("timed out", "no answer (timeout)"),
        ("Read timed out", "no answer (timeout)"),
        ("Connection reset", "connection reset"),
        ("RemoteDisconnected", "connection closed by the registry"),
        ("WRONG_VERSION_NUMBER", "not a TLS server (plain HTTP?)"),
        ("wrong version number", "not a TLS server (plain HTTP?)"),
        ("CERTIFICATE_VERIFY_FAILED", "certificate not trusted"),
    ):
        if needle in text:
            return short
    return " ".join(text.split())[:160]


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


# --------------------------------------------------------------------------- HTTP client


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor (image spec ``descriptor.md``)."""

    media_type: str
    digest: str
    size: int
    artifact_type: Optional[str] = None
    annotations: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The descriptor as JSON data (``mediaType``, ``digest``, ``size``, ...)."""
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Descriptor":
        """Parse a descriptor; raises ``KeyError``/``TypeError``/``ValueError`` when malformed."""
        return cls(media_type=str(doc["mediaType"]), digest=str(doc["digest"]), size=int(doc["size"]),
                   artifact_type=doc.get("artifactType"), annotations=dict(doc.get("annotations") or {}))


class _Oras(oras.provider.Registry):
    """oras' registry client with envbuild's transport: auth from the Docker config, no
    retry-with-sleep loop, timeouts, and one-line errors (:meth:`RegistryClient.request`)."""

    def __init__(self, owner: "RegistryClient") -> None:
        super().__init__(hostname=owner.host, insecure=True, tls_verify=owner.verify, auth_backend="basic")
        self._owner = owner

    def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):  # noqa: A002
        return self._owner.request(method, url, data=data, headers=headers, json=json, stream=stream)


class RegistryClient:
    """A client for one registry (OCI distribution API ``/v2/``).

    Args:
        host: ``host[:port]``.
        plain_http: True: plain HTTP only; False: HTTPS only; None (default): HTTPS, and
            for a loopback host plain HTTP when HTTPS does not answer (the engine treats
            127.0.0.0/8 registries as insecure by default).
        ca_cert: CA bundle for HTTPS (default: ``/etc/docker/certs.d/<host>/ca.crt`` when
            it exists, as the engine does, else the system's).
        timeout_s: seconds per request.
        credentials: default: :func:`docker_credentials` for ``host``.
    """

    def __init__(self, host: str, *, plain_http: bool | None = None, ca_cert: str | os.PathLike | None = None,
                 timeout_s: float = 30.0, credentials: Credentials | None | bool = True) -> None:
        self.host = host
        self.timeout_s = timeout_s
        certs_d = Path("/etc/docker/certs.d") / host / "ca.crt"
        self.verify: bool | str = str(ca_cert) if ca_cert else (str(certs_d) if certs_d.is_file() else True)
        self.credentials = docker_credentials(host) if credentials is True else (credentials or None)
        if plain_http:
            self._schemes = ["http"]
        elif plain_http is None and is_loopback(host):
            self._schemes = ["https", "http"]
        else:
            self._schemes = ["https"]
        self.scheme = self._schemes[0]
        self.session = requests.Session()
        self._auth_header: dict[str, str] = {}
        self._oras = _Oras(self)
        self._pinged = False

    # -- transport

    def request(self, method: str, url: str, *, data=None, headers=None, json=None, stream=False,
                params=None) -> requests.Response:  # noqa: A002
        """One HTTP request with authentication (Basic or Bearer token, as the registry's
        ``WWW-Authenticate`` asks) and one retry after a 401.

        Raises:
            Unreachable: (exit 3) connection refused, timeout, TLS failure, or the
                registry refuses the credentials / asks for credentials the Docker config
                does not have.
        """
        hdrs = dict(headers or {})
        hdrs.update(self._auth_header)
        kw = dict(data=data, json=json, stream=stream, params=params, verify=self.verify, timeout=self.timeout_s)
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
        return AuthFailed(f"registry {self.host} asks for credentials and {docker_config_path()} has none "
                           f"for it; run `docker login {self.host}`")

    def _authenticate(self, resp: requests.Response) -> None:
        scheme, params = _challenge(resp.headers.get("WWW-Authenticate", ""))
        creds = self.credentials
        if scheme == "basic":
            if not creds:
                raise self._auth_error()
            token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            self._auth_header = {"Authorization": f"Basic {token}"}
            return
        if scheme == "bearer" and params.get("realm"):
            q = {k: v for k, v in params.items() if k in ("service", "scope")}
            auth = (creds.username, creds.password) if creds else None
            tr = self.session.get(params["realm"], params=q, auth=auth, verify=self.verify, timeout=self.timeout_s)
            token = None
            if tr.status_code == 200:
                try:
                    doc = tr.json()
                    token = doc.get("token") or doc.get("access_token")
                except ValueError:
                    token = None
            if not token:
                raise self._auth_error()
            self._auth_header = {"Authorization": f"Bearer {token}"}
            return
        raise self._auth_error()

    def url(self, repository: str, kind: str, ref: str = "") -> str:
        """``<scheme>://<host>/v2/<repository>/<kind>/<ref>``."""
        return f"{self.scheme}://{self.host}/v2/{repository}/{kind}/{ref}"

    def _fail(self, r: requests.Response, what: str) -> EnvbuildError:
        detail = ""
        try:
            errs = r.json().get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errs if isinstance(e, dict))
        except ValueError:
            detail = " ".join(r.text.split())[:160]
        code = ExitCode.UNREACHABLE if r.status_code >= 500 or r.status_code in (401, 403) else ExitCode.CHECK_FAILED
        return EnvbuildError(f"registry {self.host}: {what} answered HTTP {r.status_code}"
                             + (f" ({detail})" if detail else ""), exit_code=code)

    # -- API

    def ping(self) -> None:
        """``GET /v2/`` (with credentials when asked); picks HTTPS or plain HTTP.

        Raises:
            Unreachable: (exit 3) no registry answers, or credentials are refused/missing.
        """
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

    def _ensure(self) -> None:
        if not self._pinged:
            self.ping()

    def head_manifest(self, repository: str, ref: str) -> Descriptor | None:
        """The descriptor of manifest ``ref`` (tag or digest), or None when absent (404).

        The digest is the registry's ``Docker-Content-Digest``; without that header the
        manifest is fetched and hashed.
        """
        self._ensure()
        r = self.request("HEAD", self.url(repository, "manifests", ref), headers={"Accept": MANIFEST_ACCEPT})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self._fail(r, f"HEAD manifest {repository}:{ref}")
        digest = r.headers.get("Docker-Content-Digest")
        if not digest or not _SHA256.fullmatch(digest):
            got = self.get_manifest(repository, ref)
            return got[1] if got else None
        return Descriptor(r.headers.get("Content-Type", MT_OCI_MANIFEST).split(";")[0], digest,
                          int(r.headers.get("Content-Length") or 0))

    def get_manifest(self, repository: str, ref: str) -> tuple[bytes, Descriptor] | None:
        """``(manifest bytes, descriptor)`` of ``ref``, or None when absent (404).

        Raises:
            EnvbuildError: (exit 2) ``ref`` is a digest and the bytes served hash to
                something else (content altered in the registry).
        """
        self._ensure()
        r = self.request("GET", self.url(repository, "manifests", ref), headers={"Accept": MANIFEST_ACCEPT})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self._fail(r, f"GET manifest {repository}:{ref}")
        body = r.content
        digest = sha256_digest(body)
        if _SHA256.fullmatch(ref) and digest != ref:
            raise EnvbuildError(f"registry {self.host} served manifest {repository}@{ref} with content "
                                f"{digest}: altered in the registry", field="manifest", value=ref)
        mt = r.headers.get("Content-Type", "").split(";")[0]
        try:
            mt = json.loads(body).get("mediaType") or mt
        except (ValueError, AttributeError):
            pass
        return body, Descriptor(mt, digest, len(body))

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> requests.Response:
        """PUT a manifest under ``ref`` (tag or its digest). Returns the response (201).

        Raises:
            EnvbuildError: (exit 2) refused by the registry; (exit 3) server error.
        """
        self._ensure()
        r = self.request("PUT", self.url(repository, "manifests", ref), data=body,
                         headers={"Content-Type": media_type})
        if r.status_code not in (200, 201):
            raise self._fail(r, f"PUT manifest {repository}:{ref}")
        return r

    def push_blob(self, repository: str, data: bytes, media_type: str = "application/octet-stream") -> Descriptor:
        """Upload a blob (POST then PUT, via oras; skipped when it exists). Returns its descriptor."""
        self._ensure()
        desc = Descriptor(media_type, sha256_digest(data), len(data))
        with tempfile.TemporaryDirectory(prefix="envbuild-blob-") as tmp:
            path = os.path.join(tmp, "blob")
            with open(path, "wb") as f:
                f.write(data)
            r = self._oras.upload_blob(path, f"{self.host}/{repository}", desc.to_json())
        if r.status_code not in (200, 201, 202):
            raise self._fail(r, f"blob upload to {repository}")
        return desc

    def get_blob(self, repository: str, desc: Descriptor, limit: int = 64 << 20) -> bytes:
        """Fetch a blob and check it against its descriptor (sha256 and size).

        Raises:
            EnvbuildError: (exit 2) missing (404), larger than ``limit`` bytes, or its
                content does not hash to the descriptor's digest (altered in the registry).
        """
        self._ensure()
        if desc.size > limit:
            raise EnvbuildError(f"blob of {desc.size} bytes is larger than {limit}", field="blob", value=desc.digest)
        r = self._oras.get_blob(f"{self.host}/{repository}", desc.digest)
        if r.status_code == 404:
            raise EnvbuildError(f"registry {self.host} has no blob {desc.digest} in {repository}",
                                field="blob", value=desc.digest)
        if r.status_code != 200:
            raise self._fail(r, f"GET blob {desc.digest}")
        data = r.content
        got = sha256_digest(data)
        if got != desc.digest or len(data) != desc.size:
            raise EnvbuildError(f"registry {self.host} served blob {desc.digest} of {repository} with content "
                                f"{got} ({len(data)} bytes, expected {desc.size}): altered in the registry",
                                field="blob", value=desc.digest)
        return data

    def referrers(self, repository: str, digest: str) -> tuple[list[Descriptor], str]:
        """Manifests that refer to ``digest`` (their ``subject``), and how they were found.

        Uses ``GET /v2/<repo>/referrers/<digest>``; when the registry lacks that API (404
        or not an image index), reads the fallback index tagged ``sha256-<hex>``.

        Returns:
            ``(descriptors, "referrers API" | "tag sha256-<hex>")``.
        """
        self._ensure()
        r = self.request("GET", self.url(repository, "referrers", digest), headers={"Accept": MT_OCI_INDEX})
        if r.status_code == 200 and r.headers.get("Content-Type", "").startswith(MT_OCI_INDEX):
            return self._index_entries(r.content), "referrers API"
        tag = fallback_tag(digest)
        got = self.get_manifest(repository, tag)
        return (self._index_entries(got[0]) if got else []), f"tag {tag}"

    @staticmethod
    def _index_entries(body: bytes) -> list[Descriptor]:
        try:
            doc = json.loads(body)
            return [Descriptor.from_json(m) for m in doc.get("manifests") or []]
        except (ValueError, KeyError, TypeError, AttributeError):
            return []

    def attach(self, repository: str, subject: Descriptor, blob: bytes, media_type: str, *,
               artifact_type: str = ARTIFACT_TYPE, annotations: Mapping[str, str] | None = None
               ) -> tuple[Descriptor, bytes, str]:
        """Publish ``blob`` as an OCI artifact referring to ``subject``.

        Uploads the empty config and the blob, PUTs the artifact manifest by its digest,
        and when the registry did not answer ``OCI-Subject`` (no Referrers API) adds the
        artifact to the ``sha256-<hex>`` fallback index (read, append, PUT; the spec's
        tag schema: concurrent pushers may race, the last PUT wins).

        Returns:
            ``(artifact manifest descriptor, manifest bytes, "referrers API" | "tag ...")``.
        """
        cfg = self.push_blob(repository, EMPTY_BLOB, MT_EMPTY)
        layer = self.push_blob(repository, blob, media_type)
        ann = dict(sorted((annotations or {}).items()))
        layer_json = layer.to_json()
        if ann.get(ANN_PREDICATE):
            layer_json["annotations"] = {ANN_PREDICATE: ann[ANN_PREDICATE]}
        manifest = {
            "schemaVersion": 2,
            "mediaType": MT_OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {**cfg.to_json(), "data": base64.b64encode(EMPTY_BLOB).decode()},
            "layers": [layer_json],
            "subject": Descriptor(subject.media_type, subject.digest, subject.size).to_json(),
        }
        if ann:
            manifest["annotations"] = ann
        body = attest.canonical_json(manifest)
        desc = Descriptor(MT_OCI_MANIFEST, sha256_digest(body), len(body), artifact_type, ann)
        r = self.put_manifest(repository, desc.digest, body, MT_OCI_MANIFEST)
        if r.headers.get("OCI-Subject") == subject.digest:
            return desc, body, "referrers API"
        tag = fallback_tag(subject.digest)
        got = self.get_manifest(repository, tag)
        index: dict[str, Any] = {"schemaVersion": 2, "mediaType": MT_OCI_INDEX, "manifests": []}
        if got:
            try:
                old = json.loads(got[0])
                if isinstance(old.get("manifests"), list):
                    index["manifests"] = old["manifests"]
            except ValueError:
                pass
        if not any(isinstance(m, dict) and m.get("digest") == desc.digest for m in index["manifests"]):
            index["manifests"].append(desc.to_json())
        self.put_manifest(repository, tag, attest.canonical_json(index), MT_OCI_INDEX)
        return desc, body, f"tag {tag}"


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for ``digest``: ``sha256:<hex>`` -> ``sha256-<hex>``."""
    algo, _, hexd = digest.partition(":")
    return f"{algo}-{hexd}"


# --------------------------------------------------------------------------- certificates


def _newest_first(items: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    return sorted(items, key=lambda pc: (str(pc[1].get("finished_at") or ""), pc[0].name), reverse=True)


def certificates(images_dir: str | os.PathLike, recipe: str) -> list[tuple[Path, dict]]:
    """``(path, certificate)`` of every readable ``images_dir/<recipe>/certificates/*.json``
    with schema ``envbuild.certificate/1``, newest first (by ``finished_at``)."""
    folder = image_dir(images_dir, recipe).certificates
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("schema") == "envbuild.certificate/1":
            out.append((path, doc))
    return _newest_first(out)


def _passed(cert: Mapping[str, Any]) -> bool:
    return bool((cert.get("verdict") or {}).get("passed"))


def find_certified(client: docker.DockerClient, images_dir: str | os.PathLike, recipe: str,
                   image: str | None = None):
    """The local image to publish and its passing certificate.

    With ``image``: that image, which needs a passing certificate whose ``image.id`` is its
    ID. Without: the newest passing certificate of ``recipe`` whose image is in the engine.

    Returns:
        ``(docker Image, certificate dict, certificate path)``.

    Raises:
        EnvbuildError: (exit 2) refused: no certificate, only failing ones, the image not in
            the engine, or its labels (``envbuild.recipe``, ``envbuild.lock-hash``) differ
            from the certificate's.
    """
    folder = image_dir(images_dir, recipe).certificates
    certs = certificates(images_dir, recipe)
    if image is not None:
        try:
            img = client.images.get(image)
        except docker.errors.ImageNotFound:
            raise EnvbuildError("no such image in the engine", field="image", value=image) from None
        mine = [(p, c) for p, c in certs if (c.get("image") or {}).get("id") == img.id]
        good = [(p, c) for p, c in mine if _passed(c)]
        if not good:
            if mine:
                p, c = mine[0]
                why = "; ".join((c.get("verdict") or {}).get("failures") or []) or "verdict failed"
                raise EnvbuildError(f"refused: image {image} ({img.id[:19]}) failed certification ({why}); "
                                    "fix it and certify again", file=str(p))
            raise EnvbuildError(f"refused: image {image} ({img.id[:19]}) has no certificate; run "
                                f"`envbuild certify {image}` first", file=str(folder))
        path, cert = good[0]
    else:
        good = [(p, c) for p, c in certs if _passed(c)]
        if not good:
            raise EnvbuildError(f"refused: no passing certificate for recipe {recipe}; run `envbuild make "
                                f"{recipe}` or `envbuild certify IMAGE` first", file=str(folder))
        img = None
        for path, cert in good:
            try:
                img = client.images.get((cert.get("image") or {}).get("id") or "")
                break
            except (docker.errors.ImageNotFound, docker.errors.NullResource):
                continue  # removed or rebuilt since it was certified
        if img is None:
            path, cert = good[0]
            raise EnvbuildError(f"refused: the certified image {(cert.get('image') or {}).get('id')} is not in "
                                "the engine (removed or rebuilt); build and certify again", file=str(path))
    labels = img.labels or {}
    for key, want in (("envbuild.recipe", cert.get("recipe")), ("envbuild.lock-hash", cert.get("lock_hash"))):
        if labels.get(key) != want:
            raise EnvbuildError(f"refused: image label {key} is {labels.get(key)!r}, the certificate says "
                                f"{want!r}", file=str(path))
    return img, cert, path


# --------------------------------------------------------------------------- engine


def _engine_stream(stream, what: str) -> str | None:
    digest = None
    for msg in stream:
        if not isinstance(msg, dict):
            continue
        if msg.get("error") or msg.get("errorDetail"):
            text = (msg.get("errorDetail") or {}).get("message") or msg.get("error")
            raise Unreachable(f"{what} failed: {' '.join(str(text).split())[:300]}")
        aux = msg.get("aux") or {}
        if aux.get("Digest"):
            digest = aux["Digest"]
        status = str(msg.get("status") or "")
        m = re.search(r"Digest: (sha256:[0-9a-f]{64})", status)
        if m:
            digest = m.group(1)
    return digest


def engine_push(client: docker.DockerClient, image_id: str, name: str, tag: str,
                credentials: Credentials | None) -> str:
    """Push image ``image_id`` as ``name:tag`` with the engine; returns the manifest digest.

    The local references ``name:tag`` (made for the push) and ``name@digest`` (recorded by
    the engine) are removed afterwards unless they existed before or are the image's only
    names (the image itself always stays).

    Raises:
        Unreachable: (exit 3) the engine or the registry failed the push.
    """
    ref = f"{name}:{tag}"
    try:
        before = client.images.get(image_id).attrs
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image in the engine", field="image", value=image_id) from None
    had = set(before.get("RepoTags") or []) | set(before.get("RepoDigests") or [])
    client.api.tag(image_id, name, tag, force=True)
    digest = None
    try:
        stream = client.api.push(name, tag=tag, stream=True, decode=True,
                                 auth_config=credentials.engine_auth() if credentials else None)
        digest = _engine_stream(stream, f"docker push {ref}")
    except (docker.errors.APIError, requests.exceptions.RequestException) as e:
        raise Unreachable(f"docker push {ref} failed: {' '.join(str(e).split())[:300]}") from None
    finally:
        with contextlib.suppress(docker.errors.APIError):
            after = client.images.get(image_id).attrs
            ours = [r for r in (ref, f"{name}@{digest}" if digest else None) if r and r not in had]
            others = [t for t in (after.get("RepoTags") or []) if t not in ours]
            if others:  # never remove the image's last name
                for r in ours:
                    with contextlib.suppress(docker.errors.APIError):
                        client.api.remove_image(r, noprune=True)
    if not digest or not _SHA256.fullmatch(digest):
        raise Unreachable(f"docker push {ref}: the engine reported no manifest digest")
    return digest


# --------------------------------------------------------------------------- push


@dataclass
class PushResult:
    """Outcome of :func:`push`.

    Attributes:
        repository: ``host/namespace/recipe``.
        digest: the image manifest digest in the registry, ``sha256:...``.
        tags: the tags set to it (``<lock hash 12>``, ``certified``).
        image_id: the local image ID (the certified one).
        certificate_path: the certificate published.
        attestation: the artifact manifest's digest.
        referrers: how the artifact is discoverable (``"referrers API"`` or ``"tag sha256-..."``).
        signed_by: key id of the signature, or None (unsigned).
        filesystem: the image's filesystem hash (:mod:`builder.image.fshash`), or None.
        warnings: remarks (e.g. the image was built from an older lock than the rendered one).
    """

    repository: str
    digest: str
    tags: list[str]
    image_id: str
    certificate_path: Path
    attestation: str
    referrers: str
    signed_by: Optional[str]
    filesystem: Optional[dict]
    warnings: list[str] = field(default_factory=list)


def lock12(lock_hash: str | None) -> str:
    """The image tag of a lock hash: its first 12 hex digits (``sha256:abc...`` -> ``abc...``)."""
    hexd = str(lock_hash or "").split(":", 1)[-1]
    if not re.fullmatch(r"[0-9a-f]{12,64}", hexd):
        raise EnvbuildError("is not a sha256 lock hash", field="envbuild.lock-hash", value=lock_hash)
    return hexd[:12]


def push(client: docker.DockerClient, recipe: str, registry: str, *, images_dir: str | os.PathLike = "images",
         image: str | None = None, namespace: str = DEFAULT_NAMESPACE, sign_key=None,
         plain_http: bool | None = None, ca_cert: str | None = None, fs_hash: bool = True,
         labels: Mapping[str, str] | None = None, on_progress: Callable[[str], None] | None = None) -> PushResult:
    """Publish a certified image and its certificate (see the module doc).

    Args:
        client: connected docker client.
        recipe: recipe name (``images_dir/<recipe>/certificates/``).
        registry: ``host[:port]``.
        image: push this local image (default: the newest certified one of ``recipe``).
        namespace: repository prefix (``<namespace>/<recipe>``).
        sign_key: a private key from :func:`builder.publish.attest.load_private_key`, or None.
        plain_http, ca_cert: see :class:`RegistryClient`.
        fs_hash: record the filesystem content hash (:mod:`builder.image.fshash`) in the statement: the
            certificate's own (``image.filesystem``) when it has one, else computed here.
        labels: labels for temporary containers (the filesystem export).
        on_progress: receives one-line progress messages.

    Returns:
        :class:`PushResult`.

    Raises:
        EnvbuildError: (exit 2) refused (see :func:`find_certified`).
        Unreachable: (exit 3) registry or engine unreachable, credentials refused.
    """
    say = on_progress or (lambda _msg: None)
    img, cert, cert_path = find_certified(client, images_dir, recipe, image)
    warnings = []
    lockfile = image_dir(images_dir, recipe).lock
    if lockfile.is_file() and sha256_digest(lockfile.read_bytes()) != cert.get("lock_hash"):
        warnings.append(f"{lockfile} has changed since this image was built (image lock {cert.get('lock_hash')}); "
                        "publishing the certified image as it is")
    reg = RegistryClient(registry, plain_http=plain_http, ca_cert=ca_cert)
    reg.ping()
    repository = f"{namespace}/{recipe}"
    name = f"{registry}/{repository}"
    first = lock12(cert.get("lock_hash"))
    fs = None
    if fs_hash:
        from builder.image import fshash

        recorded = (cert.get("image") or {}).get("filesystem") or cert.get("filesystem")
        if isinstance(recorded, dict) and recorded.get("method") == fshash.METHOD and recorded.get("sha256"):
            fs = dict(recorded)  # the certificate recorded it already
        else:
            say(f"hashing the filesystem of {img.id[:19]}")
            fs = fshash.image_fshash(client, img.id, labels=labels).to_json()
    say(f"pushing {name}:{first}")
    digest = engine_push(client, img.id, name, first, reg.credentials)
    got = reg.get_manifest(repository, digest)
    if got is None:
        raise Unreachable(f"registry {registry} does not list {repository}@{digest} after the push")
    manifest_bytes, subject = got
    stmt = attest.statement(
        subject_name=name,
        subject_digest=digest,
        certificate=cert,
        certificate_sha256=hashlib.sha256(cert_path.read_bytes()).hexdigest(),
        image={"id": img.id, "digest": digest, "repository": name, "tags": [first, CERTIFIED_TAG],
               "recipe": recipe, "lock_hash": cert.get("lock_hash")},
        filesystem=fs,
    )
    blob, media_type = attest.encode(stmt, sign_key)
    annotations = {
        ANN_PREDICATE: attest.PREDICATE_TYPE,
        ANN_RECIPE: recipe,
        ANN_LOCK: str(cert.get("lock_hash")),
        ANN_VERDICT: "passed",
    }
    if cert.get("finished_at"):
        annotations[ANN_CREATED] = str(cert["finished_at"])
    say(f"publishing the certificate of {name}@{digest}")
    att, att_body, how = reg.attach(repository, subject, blob, media_type, annotations=annotations)
    reg.put_manifest(repository, first + CERT_TAG_SUFFIX, att_body, MT_OCI_MANIFEST)
    # move `certified` only now that the certificate is published; its pointer last
    reg.put_manifest(repository, CERTIFIED_TAG, manifest_bytes, subject.media_type)
    reg.put_manifest(repository, CERTIFIED_TAG + CERT_TAG_SUFFIX, att_body, MT_OCI_MANIFEST)
    return PushResult(repository=name, digest=digest, tags=[first, CERTIFIED_TAG], image_id=img.id,
                      certificate_path=cert_path, attestation=att.digest, referrers=how,
                      signed_by=attest.key_id(sign_key) if sign_key is not None else None,
                      filesystem=fs, warnings=warnings)


# --------------------------------------------------------------------------- pull


class Refused(EnvbuildError):
    """A pull refused by a check (exit 2)."""


def _gpu_names(cert: Mapping[str, Any]) -> set[str]:
    names = set()
    for doc in (cert.get("probe") or {}).values():
        for g in (doc or {}).get("gpus") or []:
            if isinstance(g, dict) and g.get("name"):
                names.add(str(g["name"]))
    return names


def _version(text: Any) -> Version | None:
    try:
        return Version(str(text))
    except (InvalidVersion, TypeError):
        return None


def check_hardware(cert: Mapping[str, Any], host: Mapping[str, Any]) -> list[str]:
    """Reasons this node is not covered by the certificate ([] = covered).

    * the driver (host probe ``driver``) is below the image's floor (the lock's
      ``driver.min``, else the ``envbuild.driver.min`` label), or absent for an image
      that has one;
    * for CUDA images, a GPU model of this node (probe ``gpus[].name``) that no rank of
      the certification ran on.

    Args:
        cert: the certificate (``envbuild.certificate/1``).
        host: this node's report (:func:`builder.agent.probe.collect`).
    """
    lock = cert.get("lock") or {}
    labels = (cert.get("image") or {}).get("labels") or {}
    floor = (lock.get("driver") or {}).get("min") or labels.get("envbuild.driver.min")
    floor = None if floor in (None, "none") else str(floor)
    issues = []
    driver = host.get("driver")
    if floor:
        if not driver:
            issues.append(f"the image needs an NVIDIA driver >= {floor}; this node has none")
        elif _version(driver) is None or _version(floor) is None or _version(driver) < _version(floor):
            issues.append(f"driver {driver} is below the image's floor {floor}")
    host_gpus = [str(g.get("name")) for g in host.get("gpus") or [] if isinstance(g, dict)]
    if lock.get("cuda") and host_gpus:
        covered = _gpu_names(cert)
        if not covered:
            used = (cert.get("backend") or {}).get("used")
            issues.append(f"the certificate covers no GPU (certified with {used} on CPUs); this node has "
                          f"{', '.join(sorted(set(host_gpus)))}")
        else:
            missing = sorted({g for g in host_gpus if g not in covered})
            if missing:
                issues.append(f"GPU {', '.join(missing)} is not covered by the certificate "
                              f"({', '.join(sorted(covered))})")
    return issues


def check_image(img_attrs: Mapping[str, Any], ref: ImageRef, digest: str, cert: Mapping[str, Any],
                certified_id: str | None) -> list[str]:
    """Differences between a pulled image (``docker inspect`` data) and its certificate.

    Checks: the image is known by ``name@digest``; its ID is the certified image ID; every
    label the certificate recorded has the same value.
    """
    problems = []
    wanted = f"{ref.name}@{digest}"
    repo_digests = img_attrs.get("RepoDigests") or []
    if wanted not in repo_digests:
        problems.append(f"the engine does not list {wanted} for the pulled image ({', '.join(repo_digests) or 'none'})")
    image_id = img_attrs.get("Id")
    if certified_id and image_id != certified_id:
        problems.append(f"pulled image ID {image_id} is not the certified image ID {certified_id}")
    got = ((img_attrs.get("Config") or {}).get("Labels")) or {}
    want = (cert.get("image") or {}).get("labels") or {}
    for key in sorted(want):
        if got.get(key) != want[key]:
            problems.append(f"label {key} is {str(got.get(key))[:80]!r}, the certificate says {str(want[key])[:80]!r}")
    if cert.get("lock_hash") and got.get("envbuild.lock-hash") != cert.get("lock_hash"):
        problems.append(f"label envbuild.lock-hash is {got.get('envbuild.lock-hash')!r}, the certificate says "
                        f"{cert.get('lock_hash')!r}")
    return problems


@dataclass
class Attestation:
    """A verified certificate found in the registry.

    Attributes:
        digest: the image digest it certifies.
        manifest: the artifact manifest's digest.
        found_by: ``"tag <tag>.cert"``, ``"referrers API"`` or ``"tag sha256-..."``.
        statement: the in-toto statement; ``predicate`` its envbuild predicate.
        certificate: the certificate inside.
        signer: the verified key id, or None when no key was configured.
        signed: whether the artifact is a DSSE envelope.
    """

    digest: str
    manifest: str
    found_by: str
    statement: dict
    predicate: dict
    certificate: dict
    signer: Optional[str]
    signed: bool


def _load_attestation(reg: RegistryClient, ref: ImageRef, digest: str, body: bytes, desc: Descriptor,
                      found_by: str, public_key, key_name: str) -> Attestation:
    origin = f"{ref.name}@{desc.digest}"
    try:
        man = json.loads(body)
        layer = Descriptor.from_json((man.get("layers") or [])[0])
        subject = (man.get("subject") or {}).get("digest")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise Refused("refused: the certificate artifact is not an OCI manifest with one layer", file=origin) from None
    if subject != digest:
        raise Refused(f"refused: the certificate artifact refers to {subject}, not to the image {digest}", file=origin)
    blob = reg.get_blob(ref.repository, layer)
    stmt, signer = attest.decode(blob, layer.media_type, public_key=public_key, key_name=key_name, origin=origin)
    pred = attest.check_statement(stmt, digest, origin=origin)
    cert = pred["certificate"]
    if not _passed(cert):
        why = "; ".join((cert.get("verdict") or {}).get("failures") or []) or "verdict failed"
        raise Refused(f"refused: the published certificate did not pass ({why})", file=origin)
    return Attestation(digest=digest, manifest=desc.digest, found_by=found_by, statement=stmt, predicate=pred,
                       certificate=cert, signer=signer, signed=layer.media_type == attest.MEDIA_TYPE_DSSE)


def find_attestation(reg: RegistryClient, ref: ImageRef, public_key=None, key_name: str = "the key"
                     ) -> Attestation:
    """Resolve ``ref`` to the certified digest and fetch and verify its certificate.

    A tag is resolved to a digest; the certificate is read from the tag ``<tag>.cert``
    when it exists (and must certify that very digest), else from the referrers of the
    digest (newest by ``org.opencontainers.image.created``).

    Raises:
        Refused: (exit 2) no such tag; the tag moved (both digests printed); no certificate;
            a certificate that is altered, not passing, for another image, unsigned or
            signed by another key when ``public_key`` is configured.
        Unreachable: (exit 3) the registry cannot be reached.
    """
    reg._ensure()
    digest = ref.digest
    if ref.tag:
        d = reg.head_manifest(ref.repository, ref.tag)
        if d is None:
            raise Refused(f"refused: {ref.name}:{ref.tag} does not exist in the registry", field="reference",
                          value=str(ref))
        if digest and d.digest != digest:
            raise Refused(f"refused: {ref.name}:{ref.tag} points to {d.digest}, not to the requested {digest}")
        digest = d.digest
        pointer = reg.get_manifest(ref.repository, ref.tag + CERT_TAG_SUFFIX)
        if pointer is not None:
            body, desc = pointer
            try:
                certified = (json.loads(body).get("subject") or {}).get("digest")
            except (ValueError, AttributeError):
                certified = None
            if certified != digest:
                raise Refused(f"refused: {ref.name}:{ref.tag} points to {digest}, but its certificate "
                              f"({ref.tag}{CERT_TAG_SUFFIX}) certifies {certified}: the tag was moved after "
                              "certification")
            return _load_attestation(reg, ref, digest, body, desc, f"tag {ref.tag}{CERT_TAG_SUFFIX}",
                                     public_key, key_name)
    assert digest is not None
    found, how = reg.referrers(ref.repository, digest)
    ours = [d for d in found if d.artifact_type == ARTIFACT_TYPE
            and (d.annotations or {}).get(ANN_PREDICATE, attest.PREDICATE_TYPE) == attest.PREDICATE_TYPE]
    if not ours:
        raise Refused(f"refused: no certificate is published for {ref.name}@{digest} (looked up: {how})")
    ours.sort(key=lambda d: str((d.annotations or {}).get(ANN_CREATED) or ""), reverse=True)
    errors = []
    for d in ours:
        got = reg.get_manifest(ref.repository, d.digest)
        if got is None:
            errors.append(f"{d.digest}: listed but missing")
            continue
        try:
            return _load_attestation(reg, ref, digest, got[0], got[1], how, public_key, key_name)
        except EnvbuildError as e:
            if e.exit_code == ExitCode.UNREACHABLE:
                raise
            errors.append(str(e))
    raise Refused(f"refused: no valid certificate for {ref.name}@{digest}: {' | '.join(errors)}")


@dataclass
class PullResult:
    """Outcome of :func:`pull`.

    Attributes:
        reference: ``host/repo@sha256:...`` (what was pulled or is to be pulled).
        digest: the certified digest.
        attestation: the verified certificate.
        image_id: the pulled image ID (None for ``--format sif``).
        local_tags: tags set on the pulled image.
        warnings: hardware not covered, accepted with ``allow_uncertified_hw``.
        sif_command: the ``apptainer pull`` argv (``--format sif``), else None.
        sif_ran: whether that command was run (apptainer found) and succeeded.
    """

    reference: str
    digest: str
    attestation: Attestation
    image_id: Optional[str] = None
    local_tags: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sif_command: Optional[list[str]] = None
    sif_ran: bool = False


def sif_command(ref: ImageRef, digest: str, output: str, plain_http: bool) -> list[str]:
    """``apptainer pull [--no-https] OUTPUT docker://HOST/REPO@sha256:...`` (by digest)."""
    cmd = ["apptainer", "pull"]
    if plain_http:
        cmd.append("--no-https")
    return [*cmd, output, f"docker://{ref.name}@{digest}"]


def pull(client: docker.DockerClient | None, target: str, registry: str | None = None, *,
         namespace: str = DEFAULT_NAMESPACE, public_key=None, key_name: str = "the key",
         allow_uncertified_hw: bool = False, fmt: str = "docker", host_report: Mapping[str, Any] | None = None,
         plain_http: bool | None = None, ca_cert: str | None = None, sif_output: str | None = None,
         run_apptainer: bool = True, on_progress: Callable[[str], None] | None = None) -> PullResult:
    """Pull a certified image by digest onto this node, or refuse (see the module doc).

    Args:
        client: connected docker client (may be None for ``fmt="sif"``).
        target: recipe name or image reference (``parse_target``).
        registry: ``host[:port]`` when ``target`` names none.
        public_key: from :func:`builder.publish.attest.load_public_key`: the certificate must be a
            DSSE envelope signed by it.
        allow_uncertified_hw: hardware the certificate does not cover gives warnings
            instead of a refusal.
        fmt: ``"docker"`` (pull into the engine) or ``"sif"`` (print/run ``apptainer pull``).
        host_report: this node's report (default :func:`builder.agent.probe.collect`).
        sif_output: the SIF file (default ``<recipe>_<lock12>.sif``).
        run_apptainer: run the command when ``apptainer`` is on PATH.

    Returns:
        :class:`PullResult`.

    Raises:
        Refused: (exit 2) see :func:`find_attestation`; hardware not covered; the pulled
            image differs from the certificate (it is removed again).
        Unreachable: (exit 3) registry or engine unreachable; apptainer failed.
    """
    say = on_progress or (lambda _msg: None)
    ref = parse_target(target, registry, namespace)
    reg = RegistryClient(ref.host, plain_http=plain_http, ca_cert=ca_cert)
    reg.ping()
    say(f"resolving {ref}")
    att = find_attestation(reg, ref, public_key, key_name)
    digest = att.digest
    cert = att.certificate
    if host_report is None:
        from builder.agent import probe

        host_report = probe.collect()
    issues = check_hardware(cert, host_report)
    warnings = []
    if issues:
        if not allow_uncertified_hw:
            raise Refused("refused: this node is not covered by the certificate: " + "; ".join(issues)
                          + " (--allow-uncertified-hw to pull anyway)")
        warnings.extend(issues)
    by_digest = f"{ref.name}@{digest}"
    result = PullResult(reference=by_digest, digest=digest, attestation=att, warnings=warnings)
    tag12 = lock12(cert.get("lock_hash"))

    if fmt == "sif":
        out = sif_output or f"{cert.get('recipe') or ref.repository.rsplit('/', 1)[-1]}_{tag12}.sif"
        result.sif_command = sif_command(ref, digest, out, reg.scheme == "http")
        if run_apptainer and shutil.which("apptainer"):
            env = dict(os.environ)
            if reg.credentials:
                env["APPTAINER_DOCKER_USERNAME"] = reg.credentials.username
                env["APPTAINER_DOCKER_PASSWORD"] = reg.credentials.password
            say(" ".join(result.sif_command))
            rc = subprocess.run(result.sif_command, env=env).returncode
            if rc != 0:
                raise Unreachable(f"apptainer pull exited with {rc}", field="reference", value=by_digest)
            result.sif_ran = True
        return result
    if fmt != "docker":
        raise EnvbuildError("is not docker or sif", field="--format", value=fmt, exit_code=ExitCode.USAGE)

    assert client is not None
    certified_id = (att.predicate.get("image") or {}).get("id") or (cert.get("image") or {}).get("id")
    try:
        pre = client.images.get(by_digest)
        pre_existing = by_digest in (pre.attrs.get("RepoDigests") or [])
    except docker.errors.ImageNotFound:
        pre_existing = False
    ok = False
    added: list[str] = []
    try:
        say(f"pulling {by_digest}")
        try:
            stream = client.api.pull(ref.name, tag=digest, stream=True, decode=True,
                                     auth_config=reg.credentials.engine_auth() if reg.credentials else None)
            _engine_stream(stream, f"docker pull {by_digest}")
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            raise Unreachable(f"docker pull {by_digest} failed: {' '.join(str(e).split())[:300]}") from None
        try:
            img = client.images.get(by_digest)
        except docker.errors.ImageNotFound:
            raise Unreachable(f"docker pull {by_digest} left no image") from None
        problems = check_image(img.attrs, ref, digest, cert, certified_id)
        if problems:
            raise Refused("refused: the pulled image is not the certified one: " + "; ".join(problems),
                          field="reference", value=by_digest)
        for t in dict.fromkeys([t for t in (ref.tag, tag12) if t]):
            client.api.tag(img.id, ref.name, t, force=True)
            added.append(f"{ref.name}:{t}")
        result.image_id = img.id
        result.local_tags = added
        ok = True
        return result
    finally:
        if not ok:
            for t in added:
                with contextlib.suppress(docker.errors.APIError):
                    client.api.remove_image(t, noprune=True)
            if not pre_existing:
                with contextlib.suppress(docker.errors.APIError):
                    client.api.remove_image(by_digest)
