"""How every gRPC hop is secured: mutual TLS between processes, a token on every call.

A :class:`Security` is chosen once per process (``--tls-dir``/``--token``, or ``--insecure``)
and makes that process's server credentials, its channels to peers and the interceptor that
checks the token. What is authenticated how (see ``docs/security.md``):

- **Every connection** is mutual TLS against one CA (``DIR/ca.pem``): a server presents
  ``DIR/node.pem`` and accepts only clients that present a certificate the same CA signed;
  a client checks the server's certificate names the host it dialled. That covers the
  controller, every site's control and data plane servers, and the CLI, which presents the
  node certificate of its TLS folder too.
- **Every call** carries ``authorization: Bearer <token>`` when a token is configured, and
  every server refuses a call without it (UNAUTHENTICATED). A CA may sign certificates for
  other uses than this cluster; the token says the caller is one of ours.
- **Who a peer is** comes from its certificate's common name (:func:`peer_identity`):
  ``jetstream site NAME`` is that site (and its workers), ``jetstream controller`` and
  ``jetstream cli`` those roles; any other name (``jetstream node``, the shared development
  certificate, or a certificate of one's own CA that names no role) may act as anyone. The
  controller takes a site's registration, heartbeats and results only
  under its certificate's name, and a site takes partials only from its planned children,
  each under its own name.

:func:`make_dev_certs` (``jetstream certs``) makes a development CA, a node certificate (or
one per site, for the controller and for the CLI) and a token; it is for development, not
for production.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from jetstream.errors import ControlPlaneError

__all__ = ["CA_FILE", "CERT_FILE", "KEY_FILE", "TOKEN_FILE", "Identity", "Security",
           "http_authorized", "make_dev_certs", "peer_identity"]

log = logging.getLogger(__name__)

#: The files of a TLS folder: the CA every peer trusts, this node's certificate and key, and
#: (optionally) the token every call carries.
CA_FILE, CERT_FILE, KEY_FILE, TOKEN_FILE = "ca.pem", "node.pem", "node-key.pem", "token"
CA_KEY_FILE = "ca-key.pem"

_NO_CHOICE = ("no transport security chosen: give --tls-dir DIR (or set JETSTREAM_TLS_DIR; "
              "`jetstream certs DIR` makes a development CA and certificates there) or, to run "
              "without TLS and authentication, --insecure")


#: The common names of the roles' certificates: a site's is ``jetstream site NAME``.
SHARED_NAME, SITE_PREFIX, CONTROLLER_NAME, CLI_NAME = (
    "jetstream node", "jetstream site ", "jetstream controller", "jetstream cli")


@dataclass(frozen=True)
class Identity:
    """Who a peer's certificate says it is: ``role`` "site" (``name`` the site), "controller",
    "cli", or "any" (a certificate that names no role: the shared development one, or one of
    an operator's own CA from before roles; it acts as anyone)."""

    role: str
    name: str = ""

    def acts_as(self, site: str) -> bool:
        """Whether this peer may speak for ``site``."""
        return self.role == "any" or (self.role == "site" and self.name == site)

    def __str__(self) -> str:
        return f"site {self.name}" if self.role == "site" else f"the {self.role}"


def peer_identity(context: grpc.ServicerContext) -> Identity | None:
    """The identity of a call's peer from its TLS certificate; None on a plaintext server (in
    tests, or ``--insecure``), where nobody is checked."""
    names = (context.auth_context() or {}).get("x509_common_name") or []
    if not names:
        return None
    name = names[0].decode("utf-8", "replace")
    if name.startswith(SITE_PREFIX):
        return Identity("site", name.removeprefix(SITE_PREFIX))
    return Identity({CONTROLLER_NAME: "controller", CLI_NAME: "cli"}.get(name, "any"))


@dataclass(frozen=True)
class Security:
    """One process's transport security: mutual TLS from ``tls_dir`` and an optional
    ``token``, or, only when asked for by name, ``insecure`` (plaintext, no authentication)."""

    tls_dir: Path | None = None
    token: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.insecure and (self.tls_dir is not None or self.token):
            msg = "--insecure cannot be combined with --tls-dir or --token: choose one"
            raise ControlPlaneError(msg)
        if not self.insecure and self.tls_dir is None:
            raise ControlPlaneError(_NO_CHOICE)

    @classmethod
    def plaintext(cls) -> Security:
        """No TLS, no token: every server started with it says so loudly."""
        return cls(insecure=True)

    @classmethod
    def resolve(cls, tls_dir: str | Path | None = None, token: str | None = None,
                insecure: bool = False, env: Mapping[str, str] | None = None) -> Security:
        """A process's security from its flags, else ``JETSTREAM_TLS_DIR`` and
        ``JETSTREAM_TOKEN``, else the token file of the TLS folder.

        Raises
        ------
        ControlPlaneError
            Neither a TLS folder nor ``insecure``; both; or the folder lacks a file.
        """
        env = os.environ if env is None else env
        if insecure:
            if tls_dir is not None or token is not None:
                msg = "--insecure cannot be combined with --tls-dir or --token: choose one"
                raise ControlPlaneError(msg)
            log.warning("INSECURE: --insecure given: no TLS and no authentication; every "
                        "message can be read and forged on the way, and no peer is checked")
            return cls.plaintext()
        folder = tls_dir if tls_dir is not None else env.get("JETSTREAM_TLS_DIR") or None
        if folder is None:
            raise ControlPlaneError(_NO_CHOICE)
        token = token if token is not None else env.get("JETSTREAM_TOKEN") or None
        if token is None and (Path(folder) / TOKEN_FILE).is_file():
            token = (Path(folder) / TOKEN_FILE).read_text(encoding="utf-8").strip() or None
        security = cls(Path(folder), token)
        for name in (CA_FILE, CERT_FILE, KEY_FILE):  # a missing file is told now, not per call
            security._pem(name)
        return security

    def _pem(self, name: str) -> bytes:
        assert self.tls_dir is not None
        path = self.tls_dir / name
        try:
            return path.read_bytes()
        except OSError as e:
            msg = (f"TLS folder {self.tls_dir}: cannot read {name} ({e.strerror}); it needs "
                   f"{CA_FILE}, {CERT_FILE} and {KEY_FILE} (`jetstream certs` makes them)")
            raise ControlPlaneError(msg) from None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """Mutual TLS: this node's certificate, and only clients the CA signed (None when
        insecure)."""
        if self.insecure:
            return None
        return grpc.ssl_server_credentials(
            [(self._pem(KEY_FILE), self._pem(CERT_FILE))],
            root_certificates=self._pem(CA_FILE), require_client_auth=True)

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        """What a server runs before each call: the token check, when there is a token."""
        return [_TokenCheck(self.token)] if self.token else []

    def channel(self, address: str,
                options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A channel to a peer at ``address``: mutual TLS, and the token on every call."""
        if self.insecure:
            return grpc.insecure_channel(address, options=list(options))
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self._pem(CA_FILE), private_key=self._pem(KEY_FILE),
            certificate_chain=self._pem(CERT_FILE))
        if self.token:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(self.token))
        return grpc.secure_channel(address, credentials, options=list(options))

    def describe(self) -> str:
        if self.insecure:
            return "INSECURE (no TLS, no authentication)"
        return f"mutual TLS ({self.tls_dir})" + (" and a token" if self.token else "")


def http_authorized(authorization: str | None, token: str) -> bool:
    """Whether an HTTP ``Authorization`` header carries ``token``: ``Bearer TOKEN`` (what
    Prometheus sends) or Basic with the token as the password, any user name (what a browser
    sends once asked)."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call whose ``authorization`` is not the token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if handler is None or hmac.compare_digest(str(given).encode(), self._expected):
            return handler
        method = handler_call_details.method

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            log.warning("refused %s from %s: %s", method, context.peer(),
                        "no token" if not given else "wrong token")
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "a valid token is required (--token, JETSTREAM_TOKEN, or the token "
                          "file of the TLS folder)")

        kind = {(False, False): grpc.unary_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}
        return kind[(handler.request_streaming, handler.response_streaming)](
            refuse, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


@dataclass(frozen=True)
class DevCertificates:
    """The files :func:`make_dev_certs` wrote: ``folders`` are the TLS folders made, by whom
    they are for (``""``: every process, the shared certificate)."""

    folder: Path
    hosts: tuple[str, ...]
    not_after: datetime.datetime
    folders: dict[str, Path]


def make_dev_certs(folder: Path, hosts: Iterable[str] = (), *, days: int = 30,
                   force: bool = False, sites: Sequence[str] = ()) -> DevCertificates:
    """Write a development CA and a random token into ``folder``, and certificates: without
    ``sites``, one node certificate for both ends of every connection, there too; with them,
    a TLS folder per site (``folder/NAME``, its certificate naming the site), one for the
    controller (``folder/controller``) and one for the CLI (``folder/cli``), each with the CA
    and the token. Key and token files are readable by their owner only.

    Every certificate names ``localhost``, ``127.0.0.1`` and each of ``hosts`` (names or IP
    addresses), and is valid as server and client.

    Raises
    ------
    ControlPlaneError
        ``folder`` holds a CA already (give ``force`` to replace it), ``days`` < 1, or a site
        name that cannot be a folder or is a role's.
    """
    # Imported here: only this command needs cryptography, not every process start.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if days < 1:
        msg = f"--days {days}: certificates must be valid for at least a day"
        raise ControlPlaneError(msg)
    for site in sites:
        if not site or site in ("controller", "cli") or "/" in site or site.startswith("."):
            msg = f"--sites: {site!r} cannot be a site's folder (nor 'controller' or 'cli')"
            raise ControlPlaneError(msg)
    if len(set(sites)) != len(sites):
        msg = f"--sites names a site twice: {', '.join(sites)}"
        raise ControlPlaneError(msg)
    folder = Path(folder)
    existing = [n for n in (CA_FILE, CA_KEY_FILE) if (folder / n).exists()]
    if existing and not force:
        msg = (f"{folder} holds a CA already ({', '.join(existing)}); every certificate it "
               "signed would stop working: give --force to replace it, or another folder")
        raise ControlPlaneError(msg)
    folder.mkdir(parents=True, exist_ok=True)
    names = ["localhost", "127.0.0.1", *(h.strip() for h in hosts if h.strip())]
    names = list(dict.fromkeys(names))
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "JetStream-py dev"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("JetStream-py development CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(not_before).not_valid_after(not_after)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=False, content_commitment=False, key_encipherment=False,
              data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
              encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    alt: list[x509.GeneralName] = []
    for host in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))

    def issue(common: str) -> tuple[bytes, bytes]:
        """A certificate named ``common`` and its key, as PEM."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(not_before).not_valid_after(not_after)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False,
                    crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                # Both ends: every process serves and dials.
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    token = (secrets.token_urlsafe(32) + "\n").encode()
    _write(folder / CA_KEY_FILE, key_pem(ca_key), private=True)
    _write(folder / CA_FILE, ca_pem)
    _write(folder / TOKEN_FILE, token, private=True)
    holders = ({"": SHARED_NAME} if not sites else
               {**{site: SITE_PREFIX + site for site in sites},
                "controller": CONTROLLER_NAME, "cli": CLI_NAME})
    folders = {}
    for holder, common in holders.items():
        cert, key = issue(common)
        where = folder / holder
        where.mkdir(exist_ok=True)
        if holder:  # a folder of its own: everything a process needs
            _write(where / CA_FILE, ca_pem)
            _write(where / TOKEN_FILE, token, private=True)
        _write(where / KEY_FILE, key, private=True)
        _write(where / CERT_FILE, cert)
        folders[holder] = where
    if sites:  # a shared certificate left from before would act as anyone
        for stale in (CERT_FILE, KEY_FILE):
            (folder / stale).unlink(missing_ok=True)
    return DevCertificates(folder, tuple(names), not_after, folders)


def _write(path: Path, content: bytes, *, private: bool = False) -> None:
    """Write ``content``; a private file is created owner-only, never readable in between."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(descriptor, "wb") as out:
        out.write(content)
    os.chmod(path, 0o600 if private else 0o644)  # whatever the umask made of it
