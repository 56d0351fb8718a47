"""What the JVM reader's tests share: one compile per test session of the shipped Java sources
(broker/laminar/spark/java) and of the test drivers here (*.java), against the installed
PySpark's jars, and a way to run a driver over JSON lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
SOURCES = REPO / "broker" / "laminar" / "spark" / "java"
DRIVERS = Path(__file__).resolve().parent
JAVA_RELEASE = "17"
COMPILE_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class JavaBuild:
    """The compiled classes, the class path to run them with, and what javac warned about."""

    classes: Path
    classpath: str
    #: javac -Xlint:all's warnings, less those about the class path (PySpark's jars name
    #: jars that are not shipped)
    warnings: tuple[str, ...]

    def run(
        self,
        main: str,
        requests: Iterable[Any],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> list[dict[str, Any]]:
        """One JSON answer per request from driver `main` (a single `java` process). `env`
        replaces the environment (a UTF-8 locale is added, for the JVM's file names)."""
        lines = [json.dumps(r) for r in requests]
        environment = dict(os.environ) if env is None else {"LC_ALL": "C.UTF-8", **env}
        done = subprocess.run(
            [java(), "-cp", self.classpath, main],
            input="".join(f"{line}\n" for line in lines),
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=environment,
            cwd=cwd,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(answers) == len(lines), done.stderr
        return answers


def java() -> str:
    found = shutil.which("java")
    assert found is not None
    return found


@pytest.fixture(scope="session")
def java_build(tmp_path_factory: pytest.TempPathFactory) -> JavaBuild:
    """Every shipped source and test driver compiled once (skipped without a JDK or PySpark)."""
    javac = shutil.which("javac")
    if javac is None or shutil.which("java") is None:
        pytest.skip("no JDK on PATH (javac and java): the JVM reader cannot be compiled")
    pyspark = pytest.importorskip(
        "pyspark", reason="the JVM reader compiles against PySpark's jars"
    )
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    classes = tmp_path_factory.mktemp("jvm-classes")
    sources = sorted(SOURCES.rglob("*.java")) + sorted(DRIVERS.glob("*.java"))
    compiled = subprocess.run(
        [javac, "-Xlint:all", "--release", JAVA_RELEASE, "-encoding", "UTF-8",
         "-cp", str(jars / "*"), "-d", str(classes), *map(str, sources)],
        capture_output=True,
        text=True,
        timeout=COMPILE_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr
    warnings = tuple(
        line for line in compiled.stderr.splitlines() if "warning:" in line and "[path]" not in line
    )
    return JavaBuild(classes, f"{classes}{os.pathsep}{jars / '*'}", warnings)
