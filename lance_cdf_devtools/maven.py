"""Resolve the Kafka broker and the schema registry from Maven Central into a cache dir.

`provision()` runs Maven once; later calls see a stamp (the hash of pom.xml) and do no
network work. Editing pom.xml (a version bump) re-provisions on the next call.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

POM = Path(__file__).with_name("pom.xml")
CACHE_ENV = "LANCE_CDF_DEVTOOLS_CACHE"
_STAMP = "provisioned.sha256"


def default_cache_dir() -> Path:
    """`$LANCE_CDF_DEVTOOLS_CACHE`, else `<project root>/.cache/devtools` for a source
    checkout (editable install), else `~/.cache/lance-cdf/devtools`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return root / ".cache" / "devtools"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lance-cdf" / "devtools"


def _properties(pom: Path) -> dict[str, str]:
    """The `<properties>` of one POM, by name."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(pom).getroot().find("m:properties", ns)
    if props is None:
        raise RuntimeError(f"{pom} has no <properties>; reinstall lance-cdf")
    return {el.tag.rsplit("}", 1)[-1]: (el.text or "").strip() for el in props}


def versions() -> dict[str, str]:
    """The `<properties>` of pom.xml (kafka.version, apicurio.version, ...)."""
    return _properties(POM)


def kafka_lib(cache: Path) -> Path:
    return Path(cache) / "kafka" / "lib"


def registry_jar(cache: Path) -> Path:
    jars = sorted((Path(cache) / "apicurio").glob("*-runner.jar"))
    if not jars:
        raise FileNotFoundError(f"no Apicurio runner jar under {cache}/apicurio; run provision()")
    return jars[0]


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def _stamped(cache: Path, stamp_name: str, digest: str, *required: tuple[Path, str]) -> bool:
    """The stamp `stamp_name` holds `digest` (the POMs are unchanged) and every
    (folder, glob) in `required` matches a file (the jars are still there)."""
    try:
        stamp = (cache / stamp_name).read_text().strip()
    except OSError:
        return False
    return stamp == digest and all(any(folder.glob(pattern)) for folder, pattern in required)


def _is_current(cache: Path) -> bool:
    return _stamped(
        cache,
        _STAMP,
        _pom_hash(),
        (kafka_lib(cache), "kafka_2.13-*.jar"),
        (cache / "apicurio", "*-runner.jar"),
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise concurrent provisioning (parallel test runs sharing one cache)."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mvn(args: list[str]) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (mvn) is not on PATH; it is needed once to fetch the local Kafka broker "
            "and schema registry from Maven Central (e.g. apt-get install maven)"
        )
    cmd = [mvn, "-B", "-q", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed (exit {done.returncode}):\n"
            f"{done.stdout[-4000:]}{done.stderr[-4000:]}"
        )


def _untar(tarball: Path, dest: Path) -> None:
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(tarball) as tar:
        if hasattr(tarfile, "data_filter"):  # 3.11.4+: refuse links/paths out of dest
            tar.extractall(partial, filter="data")
        else:
            tar.extractall(partial)
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)


def provision(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Kafka jars in `<cache>/kafka/lib`, Apicurio in `<cache>/apicurio`, the Maven
    repository in `<cache>/m2`. Returns the cache dir. Idempotent and offline once done."""
    cache = Path(cache_dir).expanduser().resolve() if cache_dir else default_cache_dir()
    if _is_current(cache):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        if _is_current(cache):  # another process finished while we waited
            return cache
        for stale in ("kafka", "apicurio", "target", _STAMP):
            p = cache / stale
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        v = versions()
        repo = cache / "m2"
        artifact = ("io.apicurio", "apicurio-registry-app", v["apicurio.version"])
        _mvn(
            [
                f"-Dmaven.repo.local={repo}",
                "-f",
                str(POM),
                f"-Ddevtools.out={cache}",
                "package",
                # 2.8 copies the file without reading its POM (3.x reads it and fails: the
                # parent POM io.apicurio:apicurio-registry is not on Maven Central)
                "org.apache.maven.plugins:maven-dependency-plugin:2.8:get",
                f"-Dartifact={artifact[0]}:{artifact[1]}:{artifact[2]}:tar.gz:all",
                "-Dtransitive=false",
            ]
        )
        group, name, version = artifact
        tarball = repo.joinpath(*group.split("."), name, version, f"{name}-{version}-all.tar.gz")
        _untar(tarball, cache / "apicurio")
        shutil.rmtree(cache / "target", ignore_errors=True)
        (cache / _STAMP).write_text(_pom_hash() + "\n")
    return cache


# -- Kafka Connect + Debezium JDBC sink (the Debezium integration test) ----------------
# Separate POMs and stamp: provisioning Connect never touches the broker's cache (and a
# version bump here does not re-provision the broker).
CONNECT_POMS = (POM.with_name("connect") / "runtime.xml", POM.with_name("connect") / "plugins.xml")
_CONNECT_STAMP = "connect.sha256"


def connect_lib(cache: Path) -> Path:
    """The Connect worker's classpath folder."""
    return Path(cache) / "connect" / "lib"


def connect_plugins(cache: Path) -> Path:
    """The Connect `plugin.path` (one folder: debezium-jdbc)."""
    return Path(cache) / "connect" / "plugins"


def connect_versions() -> dict[str, str]:
    """The `<properties>` of the Connect POMs (connect.version, debezium.version, ...)."""
    out: dict[str, str] = {}
    for pom in CONNECT_POMS:
        out.update(_properties(pom))
    return out


def _connect_hash() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in CONNECT_POMS)).hexdigest()


def _connect_current(cache: Path) -> bool:
    return _stamped(
        cache,
        _CONNECT_STAMP,
        _connect_hash(),
        (connect_lib(cache), "connect-runtime-*.jar"),
        (connect_plugins(cache) / "debezium-jdbc", "debezium-connector-jdbc-*.jar"),
    )


def provision_connect(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Kafka Connect in `<cache>/connect/lib`, the Debezium JDBC sink, the PostgreSQL
    driver and Apicurio's converter in `<cache>/connect/plugins/debezium-jdbc`, from Maven
    Central into the shared `<cache>/m2`. Idempotent and offline once done."""
    cache = Path(cache_dir).expanduser().resolve() if cache_dir else default_cache_dir()
    if _connect_current(cache):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".connect.lock"):
        if _connect_current(cache):
            return cache
        for stale in ("connect", "target-connect", "target-connect-plugins", _CONNECT_STAMP):
            p = cache / stale
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        for pom in CONNECT_POMS:
            _mvn(
                [
                    f"-Dmaven.repo.local={cache / 'm2'}",
                    "-f",
                    str(pom),
                    f"-Ddevtools.out={cache}",
                    "package",
                ]
            )
        for target in ("target-connect", "target-connect-plugins"):
            shutil.rmtree(cache / target, ignore_errors=True)
        (cache / _CONNECT_STAMP).write_text(_connect_hash() + "\n")
    return cache


__all__ = [
    "connect_lib",
    "connect_plugins",
    "connect_versions",
    "default_cache_dir",
    "kafka_lib",
    "provision",
    "provision_connect",
    "registry_jar",
    "versions",
]
