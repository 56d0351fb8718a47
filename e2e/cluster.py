"""A kind cluster running Laminar's images, for the end-to-end tests and for a person.

    python3 e2e/cluster.py up [NAME]      # builds what it needs, prints the kubeconfig's path
    python3 e2e/cluster.py down [NAME]

LAMINAR_KIND_MODE picks how the cluster is made:

* ``local`` (the default where podman is installed): kind's podman provider, a node image
  built here with no registry (e2e/kind/build-node-image.sh), the broker and operator images
  built with podman (e2e/images/build.sh) and loaded with ``kind load image-archive``.
* ``docker``: kind's Docker provider and the kindest/node image kind's release pins, the
  images built with ``docker build`` and loaded with ``kind load docker-image``.

The cluster is created and deleted through pytest-kind's ``KindCluster``; kind itself comes
from e2e/kind/build-tools.sh, kubectl and helm from e2e/kube/build-binaries.sh (all pinned and
cached under ~/.cache/laminar).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_kind import KindCluster  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
KIND_DIR = ROOT / "e2e" / "kind"
IMAGE_TAG = "e2e"
BUILD_TIMEOUT_S = 3600.0
CLUSTER_TIMEOUT_S = 600.0
DEFAULT_NAME = "laminar-e2e"
# local mode: kindnetd cannot be built here (not on the Go module proxy); the node image
# carries a static CNI network instead
LOCAL_CONFIG = """\
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  disableDefaultCNI: true
"""


class ClusterError(RuntimeError):
    """A step of building or starting the cluster failed (never a reason to skip)."""


def mode() -> str:
    chosen = os.environ.get("LAMINAR_KIND_MODE")
    if chosen:
        if chosen not in ("local", "docker"):
            raise ClusterError(f"LAMINAR_KIND_MODE={chosen!r}: use 'local' or 'docker'")
        return chosen
    return "local" if shutil.which("podman") else "docker"


def why_not_here() -> str | None:
    """Why no kind cluster can run on this machine at all, or None."""
    engine = "podman" if mode() == "local" else "docker"
    if shutil.which(engine) is None:
        return f"{engine} is not installed (LAMINAR_KIND_MODE={mode()}): kind runs nodes in it"
    if shutil.which("go") is None:
        return "Go is not installed: kind, kubectl and helm are built from the Go module proxy"
    return None


def run(*args: str | Path, timeout_s: float = 600.0, env: dict[str, str] | None = None) -> str:
    """Run a command; its stdout, or ClusterError with what it printed."""
    command = [str(arg) for arg in args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    except subprocess.TimeoutExpired as timed_out:
        raise ClusterError(f"{' '.join(command)}: no answer in {timeout_s:.0f} s") from timed_out
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def _last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


@dataclass(frozen=True)
class Tools:
    kind: Path
    kubectl: Path
    helm: Path

    @classmethod
    def build(cls) -> Tools:
        kube = Path(_last_line(run(ROOT / "e2e/kube/build-binaries.sh", timeout_s=BUILD_TIMEOUT_S)))
        tools = Path(_last_line(run(KIND_DIR / "build-tools.sh", timeout_s=BUILD_TIMEOUT_S)))
        return cls(kind=tools / "kind", kubectl=kube / "kubectl", helm=kube / "helm")


def provider_env() -> dict[str, str]:
    """The environment kind needs in this mode (podman's limits file in local mode)."""
    if mode() == "docker":
        return {}
    conf = run("bash", "-c", f"source {KIND_DIR / 'versions.sh'}; use_containers_conf; "
               'echo "$CONTAINERS_CONF"')  # fmt: skip
    return {"KIND_EXPERIMENTAL_PROVIDER": "podman", "CONTAINERS_CONF": conf.strip()}


def node_image() -> str | None:
    """The node image to create the cluster from; None for kind's own pinned default."""
    if mode() == "docker":
        return None
    return _last_line(run(KIND_DIR / "build-node-image.sh", timeout_s=BUILD_TIMEOUT_S))


def build_images() -> list[str]:
    """Build the broker and operator images; their names."""
    if mode() == "local":
        built = run(ROOT / "e2e/images/build.sh", timeout_s=BUILD_TIMEOUT_S,
                    env={"LAMINAR_IMAGE_TAG": IMAGE_TAG})  # fmt: skip
        return _last_line(built).split()
    names: list[str] = []
    for dockerfile, image in (("Dockerfile.broker", "laminar-broker"),
                              ("Dockerfile.operator", "laminar-operator")):  # fmt: skip
        name = f"localhost/{image}:{IMAGE_TAG}"
        run("docker", "build", "-f", ROOT / dockerfile, "-t", name, ROOT, timeout_s=BUILD_TIMEOUT_S)
        names.append(name)
    return names


def load_images(cluster: KindCluster, images: list[str]) -> None:
    if mode() == "docker":
        for image in images:
            cluster.load_docker_image(image)
        return
    with tempfile.TemporaryDirectory(prefix="laminar-images-") as scratch:
        for image in images:  # one archive each: several names in one would be one image
            archive = Path(scratch) / "image.tar"
            run("podman", "save", "-q", "--format", "docker-archive", "-o", archive, image,
                timeout_s=CLUSTER_TIMEOUT_S)  # fmt: skip
            run(cluster.kind_path, "load", "image-archive", archive, "--name", cluster.name,
                timeout_s=CLUSTER_TIMEOUT_S)  # fmt: skip
            archive.unlink()


def up(name: str = DEFAULT_NAME, kubeconfig: Path | None = None) -> KindCluster:
    """Build what is missing, create the cluster (or reuse one of that name), load the images,
    and wait for the node to be Ready."""
    tools = Tools.build()
    os.environ.update(provider_env())  # pytest-kind runs kind with this process's environment
    if mode() == "local":
        Path("/lib/modules").mkdir(parents=True, exist_ok=True)  # kind mounts it read-only
    image = node_image()
    images = build_images()
    cluster = KindCluster(name, kubeconfig, image=image, kind_path=tools.kind,
                          kubectl_path=tools.kubectl)  # fmt: skip
    if name in run(tools.kind, "get", "clusters").split():  # reused: its kubeconfig here too
        cluster.kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
        run(tools.kind, "export", "kubeconfig", "--name", name,
            "--kubeconfig", cluster.kubeconfig_path)  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write(LOCAL_CONFIG if mode() == "local" else "kind: Cluster\n"
                     "apiVersion: kind.x-k8s.io/v1alpha4\n")  # fmt: skip
    try:
        cluster.create(config_file=config.name)
    except subprocess.CalledProcessError as failed:
        raise ClusterError(f"kind create cluster {name} failed ({failed.returncode})") from failed
    finally:
        os.unlink(config.name)
    load_images(cluster, images)
    cluster.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=300s")
    return cluster


def down(name: str = DEFAULT_NAME) -> None:
    tools = Tools.build()
    os.environ.update(provider_env())
    KindCluster(name, kind_path=tools.kind, kubectl_path=tools.kubectl).delete()


def main() -> None:
    action = sys.argv[1] if len(sys.argv) > 1 else "up"
    name = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_NAME
    if action == "up":
        print(up(name).kubeconfig_path.resolve())
    elif action == "down":
        down(name)
    else:
        sys.exit(f"usage: {sys.argv[0]} up|down [NAME]")


if __name__ == "__main__":
    main()
