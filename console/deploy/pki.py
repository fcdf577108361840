"""A deployment's small certificate authority: one CA, a certificate per nats-server.

Every client verifies the server it connects to against the CA; servers verify each other on
routes and leaf connections the same way. Clients prove who they are with their nkey, not a
certificate, so one revoked agent needs no certificate revocation list.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_YEARS = 10
SERVER_DAYS = 825


@dataclass(frozen=True)
class KeyCert:
    key_pem: bytes
    cert_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("not an EC private key")
        return key


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)
_BOTH_ENDS = x509.ExtendedKeyUsage(
    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
)


def new_ca(name: str) -> KeyCert:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} MARS CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365 * CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return KeyCert(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def server_cert(ca: KeyCert, name: str, hosts: list[str]) -> KeyCert:
    """A certificate for one nats-server, valid for each of `hosts` (names or addresses), for
    serving clients and for both ends of routes and leaf connections."""
    key = _key()
    now = _now()
    sans: list[x509.GeneralName] = []
    for h in dict.fromkeys([*hosts, name]):
        sans.append(_san(h))
    ca_cert = ca.cert
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_BOTH_ENDS, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.private_key().public_key()),
            critical=False,
        )
        .sign(ca.private_key(), hashes.SHA256())
    )
    return KeyCert(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def covers(kc: KeyCert, hosts: list[str]) -> bool:
    """Whether a certificate already names every host (kept, else made again)."""
    try:
        ext = kc.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(v) for v in ext.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in ext.get_values_for_type(x509.IPAddress)}
    left = kc.cert.not_valid_after_utc - _now()
    return all(h in have for h in hosts) and left > dt.timedelta(days=30)


def read(dir_: Path, stem: str) -> KeyCert | None:
    key, cert = dir_ / f"{stem}-key.pem", dir_ / f"{stem}.pem"
    if key.is_file() and cert.is_file():
        return KeyCert(key.read_bytes(), cert.read_bytes())
    return None
