"""Resolve the broker and registry jars once into a project-local cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

APICURIO = ("io.apicurio", "apicurio-registry-app", "3.0.9")
POM = Path(__file__).with_name("pom.xml")


def cache_dir() -> Path:
    default = Path(__file__).resolve().parents[2] / ".cache" / "devtools"
    return Path(os.environ.get("LANCE_CDF_DEVTOOLS_CACHE", default))


def _mvn(args: list[str], repo: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is not installed; install it (apt-get install maven)")
    cmd = [mvn, "-B", "-q", f"-Dmaven.repo.local={repo}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def provision(cache: Path | None = None) -> Path:
    """Kafka jars in `<cache>/kafka/lib`, Apicurio in `<cache>/apicurio`; no
    network work when both are already there."""
    cache = Path(cache or cache_dir())
    repo = cache / "m2"
    kafka_lib = cache / "kafka" / "lib"
    if not any(kafka_lib.glob("kafka_2.13-*.jar")):
        _mvn(["-f", str(POM), f"-Ddevtools.out={cache}", "package"], repo)
    registry = cache / "apicurio"
    if not any(registry.glob("*-runner.jar")):
        group, artifact, version = APICURIO
        _mvn(
            [
                "dependency:get",
                f"-Dartifact={group}:{artifact}:{version}:tar.gz:all",
                "-Dtransitive=false",
            ],
            repo,
        )
        tarball = repo / Path(*group.split(".")) / artifact / version
        tarball = tarball / f"{artifact}-{version}-all.tar.gz"
        tmp = registry.with_name("apicurio.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")
        shutil.rmtree(registry, ignore_errors=True)
        tmp.rename(registry)
    return cache
