"""A throw-away certificate authority and server certificates for 127.0.0.1 (Python's
`cryptography`), made per run for the SASL_SSL broker and the TLS registry proxy.

`CertAuthority(dir).issue("kafka")` writes `ca.pem` (the truststore librdkafka and the
schema-registry client read), and per server a PEM chain + key and a PKCS#12 keystore
(what the Kafka broker reads). `java_truststore(ca.pem, dir)` makes the PKCS#12
truststore a Java HTTP client needs (Apicurio's converter in Kafka Connect: the JDK reads
no PEM truststore). Nothing is reused across runs."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerCert:
    cert_pem: Path  # the server certificate then the CA's
    key_pem: Path  # the unencrypted private key (mode 0600)
    keystore: Path  # PKCS#12: key + chain, encrypted with keystore_password
    keystore_password: str


class CertAuthority:
    """A CA made at construction; `issue(name)` a certificate for 127.0.0.1 / localhost."""

    def __init__(self, directory: str | os.PathLike[str]):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lance-cdf test CA")])
        now = dt.datetime.now(dt.UTC)
        self._name = name
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca_pem = self.dir / "ca.pem"
        self.ca_pem.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str) -> ServerCert:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import pkcs12
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        cert_pem = self.dir / f"{name}.pem"
        cert_pem.write_bytes(cert.public_bytes(pem) + self._cert.public_bytes(pem))
        key_pem = self.dir / f"{name}.key"
        key_pem.touch(mode=0o600)
        key_pem.write_bytes(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
        password = secrets.token_urlsafe(16)
        keystore = self.dir / f"{name}.p12"
        keystore.touch(mode=0o600)
        keystore.write_bytes(
            pkcs12.serialize_key_and_certificates(
                name.encode(),
                key,
                cert,
                [self._cert],
                serialization.BestAvailableEncryption(password.encode()),
            )
        )
        return ServerCert(cert_pem, key_pem, keystore, password)


@dataclass(frozen=True)
class JavaTruststore:
    path: Path  # PKCS#12 holding the CA as a trusted certificate entry
    password: str


def java_truststore(
    ca_pem: str | os.PathLike[str], directory: str | os.PathLike[str]
) -> JavaTruststore:
    """A PKCS#12 truststore with `ca_pem` as its one trusted entry, made with the JDK's
    `keytool` (a store from Python's `cryptography` lacks the attribute Java needs to take
    a certificate as trusted). The store password goes through the environment, not argv."""
    from lance_cdf_devtools.process import java_executable

    keytool = Path(java_executable()).with_name("keytool")
    path = Path(directory) / "truststore.p12"
    path.unlink(missing_ok=True)
    password = secrets.token_urlsafe(16)
    done = subprocess.run(
        [
            str(keytool),
            "-importcert",
            "-noprompt",
            "-alias",
            "ca",
            "-file",
            str(ca_pem),
            "-keystore",
            str(path),
            "-storetype",
            "PKCS12",
            "-storepass:env",
            "TRUSTSTORE_PASSWORD",
        ],
        env={**os.environ, "TRUSTSTORE_PASSWORD": password},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"keytool -importcert failed: {(done.stdout + done.stderr)[-2000:]}")
    return JavaTruststore(path, password)


__all__ = ["CertAuthority", "JavaTruststore", "ServerCert", "java_truststore"]
