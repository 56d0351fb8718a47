"""The `laminar-jvm` connector's jar: the Java sources shipped in this package (`java/`),
compiled against the installed PySpark's own jars, once per version of both.

    python -m laminar.spark.jar         # prints the jar's path (building it if needed)
    spark = SparkSession.builder.config("spark.jars", jar_path()).getOrCreate()

The jar is cached under $LAMINAR_SPARK_JAR_CACHE, else ~/.cache/laminar/spark-jar, in a
directory named by a digest of the sources, the PySpark version and the compiler's version:
a changed source or an upgraded Spark builds a new one. Building needs a JDK's `javac`
(17 or newer: Spark 4 runs on 17); Spark itself needs only the jar.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "java"
JAR_NAME = "laminar-spark.jar"
CACHE_ENV = "LAMINAR_SPARK_JAR_CACHE"
#: Java's release the classes are compiled for: Spark 4's least.
JAVA_RELEASE = "17"


class JarBuildError(RuntimeError):
    """The jar could not be built (no javac, or it failed): the message says why."""


def _pyspark_jars() -> Path:
    try:
        import pyspark
    except ImportError:
        raise JarBuildError("pip install 'laminar-mq[spark]': building needs PySpark") from None
    return Path(pyspark.__file__).resolve().parent / "jars"


def _javac() -> str:
    javac = shutil.which("javac")
    if javac is None:
        raise JarBuildError(
            f"building the laminar-jvm jar needs a JDK's javac ({JAVA_RELEASE} or newer) on PATH"
        )
    return javac


def _digest(javac: str) -> str:
    """What the jar is built from: every shipped source, PySpark's version, javac's version."""
    import pyspark

    digest = hashlib.sha256()
    for path in sorted(p for p in SOURCES.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(SOURCES)).encode() + b"\0" + path.read_bytes())
    version = subprocess.run([javac, "-version"], capture_output=True, text=True, check=False)
    digest.update(f"{pyspark.__version__}\0{version.stdout}{version.stderr}".encode())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "laminar" / "spark-jar")


def jar_path() -> Path:
    """The jar for this PySpark, built now if the cache has none (JarBuildError if it cannot
    be). Builds race safely: each compiles in a directory of its own and renames the jar in."""
    javac = _javac()
    jar = cache_dir() / _digest(javac) / JAR_NAME
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        sources = [str(p) for p in sorted(SOURCES.rglob("*.java"))]
        classpath = str(_pyspark_jars() / "*")
        done = subprocess.run(
            [javac, "--release", JAVA_RELEASE, "-nowarn", "-encoding", "UTF-8",
             "-cp", classpath, "-d", str(classes), *sources],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise JarBuildError(f"javac failed:\n{done.stdout}{done.stderr}")
        built = Path(tmp) / JAR_NAME
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
            for path in sorted((SOURCES / "META-INF").rglob("*")):
                if path.is_file():
                    archive.write(path, path.relative_to(SOURCES).as_posix())
        os.replace(built, jar)
    return jar


def main() -> int:
    try:
        print(jar_path())
    except JarBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
