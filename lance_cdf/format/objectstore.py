"""Tables on object storage (s3://, gs://, az://, ...) through one client, obstore.

obstore wraps the Rust `object_store` crate that Lance itself uses, so the
`storage_options` a user already gives pylance (`aws_endpoint`, `aws_region`,
`aws_access_key_id`, `allow_http`, ...) mean the same thing here; environment
variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`) are read the same way too. Every
request is counted in `ObjectStoreFileSystem.requests` so benchmarks and tests
can see what a query costs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlparse

from lance_cdf.errors import LanceCdfError, StorageAccessError, UnsupportedStorageError, in_words

# URI scheme -> (obstore store kind, prefix of that store's configuration keys)
SCHEMES = {
    "s3": ("s3", "aws_"),
    "s3a": ("s3", "aws_"),
    "gs": ("gcs", "google_"),
    "gcs": ("gcs", "google_"),
    "az": ("azure", "azure_"),
    "abfs": ("azure", "azure_"),
    "abfss": ("azure", "azure_"),
    "azure": ("azure", "azure_"),
    "adl": ("azure", "azure_"),
}

# Unprefixed names `object_store` also accepts for a store's own keys.
SHORT_KEYS = {
    "s3": {
        "access_key_id",
        "secret_access_key",
        "session_token",
        "token",
        "region",
        "default_region",
        "endpoint",
        "endpoint_url",
        "bucket",
        "virtual_hosted_style_request",
        "skip_signature",
        "unsigned_payload",
        "checksum_algorithm",
        "request_payer",
        "server_side_encryption",
        "sse_kms_key_id",
        "sse_bucket_key_enabled",
        "s3_express",
        "imdsv1_fallback",
        "metadata_endpoint",
        "role_arn",
        "role_session_name",
        "web_identity_token_file",
        "sts_endpoint",
    },
    "gcs": {"service_account", "service_account_key", "application_credentials", "bucket"},
    "azure": {
        "account_name",
        "account_key",
        "client_id",
        "client_secret",
        "tenant_id",
        "authority_host",
        "sas_key",
        "token",
        "use_emulator",
        "use_fabric_endpoint",
        "endpoint",
        "msi_endpoint",
        "object_id",
        "msi_resource_id",
        "federated_token_file",
        "use_azure_cli",
        "skip_signature",
        "container_name",
    },
}

# HTTP client settings (object_store's ClientConfigKey), shared by every store kind.
CLIENT_KEYS = {
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_max_frame_size",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "randomize_addresses",
    "timeout",
    "user_agent",
}

# Lance's retry settings (its defaults: 10 retries within 180 s).
RETRY_KEYS = {"client_max_retries", "client_retry_timeout"}

# S3 serves at most this many keys per LIST response.
LIST_PAGE = 1000


def is_object_store_uri(uri: str) -> bool:
    return urlparse(uri).scheme.lower() in SCHEMES


def store_arguments(uri: str, storage_options: dict[str, str] | None) -> dict[str, Any]:
    """Keyword arguments for `obstore.store.from_url(uri, **...)` from Lance's
    `storage_options`: store keys go to `config`, HTTP settings to `client_options`,
    Lance's retry settings to `retry_config`. Lance-only tuning knobs that have no
    meaning for reading (`block_size`, `download_retry_count`, ...) are dropped."""
    scheme = urlparse(uri).scheme.lower()
    if scheme not in SCHEMES:
        raise UnsupportedStorageError(
            f"cannot read {uri!r}: unknown URI scheme {scheme!r}. Use a local path, file://, "
            f"or one of {', '.join(sorted(s + '://' for s in SCHEMES))}."
        )
    kind, prefix = SCHEMES[scheme]
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    retry: dict[str, int | timedelta] = {}
    for key, value in (storage_options or {}).items():
        name = str(key).lower()
        value = str(value)
        if name in CLIENT_KEYS:
            client[name] = value
        elif name == "client_max_retries":
            retry["max_retries"] = _int_option(key, value)
        elif name == "client_retry_timeout":
            retry["retry_timeout"] = timedelta(seconds=_int_option(key, value))
        elif name.startswith(prefix):
            config[name] = value
        elif name in SHORT_KEYS[kind]:
            config[prefix + name] = value
    out: dict[str, Any] = {"config": config, "client_options": client}
    if retry:
        out["retry_config"] = retry
    return out


def _int_option(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise LanceCdfError(
            f"storage option {key}={value!r} must be a whole number (as for pylance)."
        ) from None


class ObjectStoreFileSystem:
    """A table under an object-store URI, read with obstore; counts its requests."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        import obstore
        from obstore.store import from_url

        self._obstore = obstore
        self.uri = uri.rstrip("/")
        self.root = self.uri
        self.requests: Counter[str] = Counter()  # by kind: get, get_range, list, head
        self.paths: Counter[str] = Counter()  # by path, to check what is read twice
        self._count_lock = threading.Lock()
        args = store_arguments(uri, storage_options)
        self._endpoint = args["config"].get("aws_endpoint") or args["config"].get(
            "aws_endpoint_url"
        )
        try:
            self.store = from_url(self.uri, **args)
        except Exception as exc:  # obstore raises its own types, and panics on bad keys
            raise StorageAccessError(
                f"cannot configure the object store for {uri!r}: {_first_line(exc)}. Check the "
                "storage_options keys and values (the names pylance accepts, e.g. aws_endpoint, "
                "aws_region, aws_access_key_id, aws_secret_access_key, allow_http)."
            ) from None

    def _count(self, kind: str, n: int = 1, path: str | None = None) -> None:
        with self._count_lock:
            self.requests[kind] += n
            if path is not None:
                self.paths[path] += n

    def _call(self, kind: str, path: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """One counted request; FileNotFoundError for a missing object, a
        StorageAccessError naming the cause and the fix for anything else."""
        self._count(kind, path=path)
        try:
            return fn(self.store, *args, **kw)
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise self._error(exc, path) from None
            raise
        except Exception as exc:  # obstore's own error types: one clear error names the call
            raise self._error(exc, path) from None

    def read(self, path: str) -> bytes:
        return cast(bytes, self._call("get", path, self._obstore.get, path).bytes().to_bytes())

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        get_range = self._obstore.get_range
        got = self._call("get_range", path, get_range, path, start=offset, length=size)
        return cast(bytes, got.to_bytes())

    def list_dir(self, path: str) -> list[str]:
        """Names directly under `path`. Counted as one LIST request per 1000 names, the
        page size of S3's ListObjectsV2."""
        prefix = path.rstrip("/")
        try:
            result = self._call("list", path, self._obstore.list_with_delimiter, prefix)
        except FileNotFoundError:
            return []
        names = [o["path"].rsplit("/", 1)[-1] for o in result["objects"]]
        names += [p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"]]
        self._count("list", max(0, -(-len(names) // LIST_PAGE) - 1), path)
        return names

    def exists(self, path: str) -> bool:
        try:
            self._call("head", path, self._obstore.head, path)
            return True
        except FileNotFoundError:
            return False

    def request_count(self) -> int:
        with self._count_lock:
            return sum(self.requests.values())

    def reset_counts(self) -> None:
        with self._count_lock:
            self.requests.clear()
            self.paths.clear()

    def _error(self, exc: Exception, path: str) -> LanceCdfError:
        from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

        where = f"{self.root}/{path}"
        text = _first_line(exc)
        if "NoSuchBucket" in str(exc):
            bucket = urlparse(self.uri).netloc
            return StorageAccessError(
                f"the bucket {bucket!r} of {self.uri!r} does not exist on "
                f"{self._endpoint or 'the store'}. Check the bucket name in the URI (and "
                "aws_endpoint / aws_region), or create the bucket."
            )
        if any(m in str(exc) for m in ("/latest/api/token", "/latest/meta-data", "169.254.")):
            return StorageAccessError(
                f"no credentials to read {where}: none were given, so the client asked the "
                f"instance metadata service, which failed ({text}). Give aws_access_key_id and "
                "aws_secret_access_key in storage_options (or the AWS_* environment variables), "
                "or aws_skip_signature=true for a public bucket."
            )
        if isinstance(exc, UnauthenticatedError | PermissionDeniedError) or any(
            code in str(exc)
            for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403")
        ):
            return StorageAccessError(
                f"access to {where} was refused ({text}). Check the credentials in "
                "storage_options (aws_access_key_id / aws_secret_access_key / "
                "aws_session_token, or the AWS_* environment variables) and that they may read "
                "the bucket."
            )
        if "error sending request" in str(exc) or "connect" in str(exc).lower():
            endpoint = self._endpoint or "the default endpoint of the store"
            return StorageAccessError(
                f"cannot reach {endpoint} to read {where} ({text}). Check that the server is "
                "running and that aws_endpoint (with allow_http=true for http://) is right."
            )
        return StorageAccessError(f"cannot read {where}: {text}")

    def __repr__(self) -> str:
        return f"<ObjectStoreFileSystem {self.root}>"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].rstrip(".") if text else in_words(exc)


__all__ = ["ObjectStoreFileSystem", "is_object_store_uri", "store_arguments"]
