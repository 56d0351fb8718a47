"""`laminar-xdp`: load, unload and read the XDP router (broker/xdp/router.c).

    laminar-xdp load --iface eth0 [--config xdp.json] [--mode auto|native|generic]
                     [--steer-workers N] [--steer-owner UID]
    laminar-xdp unload --iface eth0
    laminar-xdp stats                      # JSON: packets, bytes, drops per class

The program and its maps are pinned under `--pin-dir` (default /sys/fs/bpf/laminar): `prog`,
`config` (ports and xxh64(cluster id), written before the program is attached) and `counters`
(per-CPU packets, bytes, drops per class; readable by everyone, so that the unprivileged broker
can export them). The configuration comes from `--config` (a JSON
object with cluster_id, gossip_port, api_port, peer_port) or else from the same flags and
LAMINAR_* variables as `laminar serve`, so the init container shares the brokers' ConfigMap.

With more than one worker (`--steer-workers`, else LAMINAR_WORKERS as `laminar serve` reads
it), `load` also pins the steer port's eBPF program for that many workers and its empty map
(`steer-prog`, `steer-map`, mode 600, owned by `--steer-owner`): the broker's supervisor, which
may not load BPF itself, fills the map with its sockets and attaches the program
(`laminar.server.steering`, docs/workers.md). A failure there is reported and leaves the
router attached: the broker then falls back to a program of its own.

Loading twice replaces; unloading when nothing is loaded succeeds. Loading is done by bpftool
(libbpf) and iproute2, reading the counters by bpf(2) directly. BPF needs root, or CAP_BPF and
CAP_NET_ADMIN. Where it is not permitted the command says so and exits 3, or, with
`--best-effort`, says so and exits 0: the broker runs the same without the router.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import bpf
from .server import steering
from .server.config import (
    DEFAULT_API_PORT,
    DEFAULT_GOSSIP_PORT,
    DEFAULT_PEER_PORT,
    DEFAULT_XDP_PIN_DIR,
)
from .swim.codec import cluster_hash
from .workers import usable_cores

DEFAULT_PIN_DIR = DEFAULT_XDP_PIN_DIR
BPF_FS = Path("/sys/fs/bpf")
#: Where the image puts the compiled router (Dockerfile.broker); LAMINAR_XDP_OBJECT overrides.
DEFAULT_OBJECT = Path("/usr/lib/laminar/router.o")
#: The indexes of the counters map, as router.c numbers its classes.
CLASSES = ("other", "membership", "api", "peer")
#: struct laminar_config in router.c: three u16 ports, a reserved u16, the u64 cluster hash.
CONFIG_LAYOUT = struct.Struct("<HHHHQ")
EXIT_FAILED = 1
EXIT_NOT_PERMITTED = 3


class XdpError(Exception):
    """A step failed; the message says which and why."""


class NotPermitted(XdpError):
    """BPF or XDP is not allowed here (not root / no CAP_BPF, or a locked-down kernel)."""


@dataclass(frozen=True)
class RouterConfig:
    cluster_id: str
    gossip_port: int
    api_port: int
    peer_port: int

    def __post_init__(self) -> None:
        if not self.cluster_id:
            raise XdpError("the cluster id is empty")
        for field in ("gossip_port", "api_port", "peer_port"):
            port = getattr(self, field)
            if not 0 < port < 65536:
                raise XdpError(f"{field} must be 1..65535, not {port}")

    def packed(self) -> bytes:
        """The `config` map's value, as router.c lays it out."""
        return CONFIG_LAYOUT.pack(
            self.gossip_port, self.api_port, self.peer_port, 0, cluster_hash(self.cluster_id)
        )

    @classmethod
    def from_file(cls, path: str) -> RouterConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise XdpError(f"cannot read the config {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise XdpError(f"{path}: expected a JSON object")
        unknown = set(raw) - {"cluster_id", "gossip_port", "api_port", "peer_port"}
        if unknown:
            raise XdpError(f"{path}: unknown keys {sorted(unknown)}")
        try:
            return cls(
                cluster_id=str(raw["cluster_id"]),
                gossip_port=int(raw.get("gossip_port", DEFAULT_GOSSIP_PORT)),
                api_port=int(raw.get("api_port", DEFAULT_API_PORT)),
                peer_port=int(raw.get("peer_port", DEFAULT_PEER_PORT)),
            )
        except KeyError as exc:
            raise XdpError(f"{path}: cluster_id is required") from exc
        except (TypeError, ValueError) as exc:
            raise XdpError(f"{path}: ports must be integers ({exc})") from exc


def _run(*command: str) -> str:
    """Run one bpftool / ip command; its stderr becomes the error."""
    if shutil.which(command[0]) is None:
        raise XdpError(f"{command[0]} is not installed (Debian: bpftool, iproute2)")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        message = f"{' '.join(command)}: {detail[-1] if detail else f'exit {done.returncode}'}"
        if any(
            word in (done.stderr or "")
            for word in ("Operation not permitted", "Permission denied", "EPERM")
        ):
            raise NotPermitted(
                f"{message} (BPF needs root, or CAP_BPF and CAP_NET_ADMIN: "
                "a privileged init container)"
            )
        raise XdpError(message)
    return done.stdout


CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF = 12, 21, 39


def _check_capabilities() -> None:
    """Attaching XDP needs CAP_NET_ADMIN; loading BPF needs CAP_BPF (or CAP_SYS_ADMIN)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return  # not Linux's procfs: let the tools say
    line = next((x for x in status.splitlines() if x.startswith("CapEff:")), None)
    if line is None:
        return
    effective = int(line.split()[1], 16)
    has = {cap for cap in (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF) if effective >> cap & 1}
    if CAP_NET_ADMIN not in has or not has & {CAP_BPF, CAP_SYS_ADMIN}:
        raise NotPermitted(
            f"uid {os.geteuid()} lacks CAP_BPF and CAP_NET_ADMIN (run it as root in a "
            "privileged init container)"
        )


def _ensure_bpffs(pin_dir: Path) -> None:
    if not BPF_FS.is_dir():
        raise NotPermitted(f"{BPF_FS} does not exist: this kernel or container has no bpffs")
    if not os.path.ismount(BPF_FS) and BPF_FS in pin_dir.parents:
        _run("mount", "-t", "bpf", "bpf", str(BPF_FS))
    try:
        pin_dir.mkdir(parents=True, exist_ok=True)
    except PermissionError as exc:
        raise NotPermitted(f"cannot create {pin_dir}: {exc}") from exc


def _interface_exists(iface: str) -> bool:
    return Path("/sys/class/net", iface).exists()


def unload(iface: str, pin_dir: Path = DEFAULT_PIN_DIR) -> None:
    """Detach whatever XDP program `iface` runs and remove the pins; nothing loaded is fine."""
    if not _interface_exists(iface):
        raise XdpError(f"no interface {iface!r}")
    _run("ip", "link", "set", "dev", iface, "xdp", "off")
    for name in ("prog", "config", "counters", steering.PINNED_PROGRAM, steering.PINNED_MAP):
        try:
            (pin_dir / name).unlink()
        except FileNotFoundError:
            pass
        except PermissionError as exc:
            raise NotPermitted(f"cannot remove {pin_dir / name}: {exc}") from exc


def load(
    iface: str,
    config: RouterConfig,
    *,
    obj: Path = DEFAULT_OBJECT,
    pin_dir: Path = DEFAULT_PIN_DIR,
    mode: str = "auto",
) -> str:
    """Load the router onto `iface` (replacing any program there); returns the mode used,
    "native" or "generic"."""
    if mode not in ("auto", "native", "generic"):
        raise XdpError(f"mode must be auto, native or generic, not {mode!r}")
    if not obj.is_file():
        raise XdpError(f"no XDP object at {obj} (build it with broker/xdp/build.sh)")
    if not _interface_exists(iface):
        raise XdpError(f"no interface {iface!r}")
    _check_capabilities()
    _ensure_bpffs(pin_dir)
    unload(iface, pin_dir)
    prog = pin_dir / "prog"
    _run("bpftool", "prog", "load", str(obj), str(prog), "type", "xdp", "pinmaps", str(pin_dir))
    value = " ".join(f"{b:02x}" for b in config.packed())
    _run(
        "bpftool", "map", "update", "pinned", str(pin_dir / "config"),
        "key", "hex", "00", "00", "00", "00", "value", "hex", *value.split(),
    )  # fmt: skip
    # the unprivileged broker may read the counters (opened read-only: on Linux >= 6.5 the
    # file's permission is enough); the program and its configuration stay root's
    pin_dir.chmod(0o755)
    (pin_dir / "counters").chmod(0o444)
    tried = ["native", "generic"] if mode == "auto" else [mode]
    errors = []
    for attempt in tried:
        flag = "xdpdrv" if attempt == "native" else "xdpgeneric"
        try:
            _run("ip", "link", "set", "dev", iface, flag, "pinned", str(prog))
            return attempt
        except NotPermitted:
            raise
        except XdpError as exc:
            errors.append(str(exc))
    unload(iface, pin_dir)
    raise XdpError("could not attach: " + "; ".join(errors))


BPF_F_RDONLY = 1 << 3  # open a pinned map for reading only: file read permission suffices
COUNTER_LAYOUT = struct.Struct("<QQQ")  # struct class_counters: packets, bytes, drops


def _xdp_error(e: OSError) -> XdpError:
    if e.errno in (errno.EPERM, errno.EACCES):
        return NotPermitted(
            f"{e.strerror} (reading the counters needs read permission on the pinned map "
            "and Linux >= 6.5, or CAP_BPF)"
        )
    return XdpError(e.strerror or str(e))


def _possible_cpus() -> int:
    """How many values a per-CPU map holds per key (the kernel's possible CPUs)."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def stats(pin_dir: Path = DEFAULT_PIN_DIR) -> dict[str, dict[str, int]]:
    """Packets, bytes and drops per class, summed over CPUs; empty when nothing is pinned.
    Read with bpf(2) directly (no bpftool), so the broker can export them at every scrape."""
    counters = pin_dir / "counters"
    if not counters.exists():
        return {}
    try:
        fd = bpf.obj_get(counters, BPF_F_RDONLY)
    except OSError as e:
        raise _xdp_error(e) from e
    try:
        cpus = _possible_cpus()
        totals: dict[str, dict[str, int]] = {}
        for index, name in enumerate(CLASSES):
            key = ctypes.create_string_buffer(struct.pack("<I", index), 4)
            value = ctypes.create_string_buffer(COUNTER_LAYOUT.size * cpus)
            attr = struct.pack("<IIQQQ", fd, 0, ctypes.addressof(key), ctypes.addressof(value), 0)
            try:
                bpf.call(bpf.MAP_LOOKUP_ELEM, attr)
            except OSError as e:
                raise _xdp_error(e) from e
            per_cpu = list(COUNTER_LAYOUT.iter_unpack(value.raw))
            summed = (sum(column) for column in zip(*per_cpu, strict=True))
            totals[name] = dict(zip(("packets", "bytes", "drops"), summed, strict=True))
        return totals
    finally:
        os.close(fd)


def _config_from(args: argparse.Namespace) -> RouterConfig:
    if args.config:
        return RouterConfig.from_file(args.config)
    return RouterConfig(
        cluster_id=args.cluster_id,
        gossip_port=args.gossip_port,
        api_port=args.api_port,
        peer_port=args.peer_port,
    )


def _parser() -> argparse.ArgumentParser:
    def env(name: str, default: str) -> str:
        return os.environ.get("LAMINAR_" + name, default)

    parser = argparse.ArgumentParser(prog="laminar-xdp", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pin-dir", type=Path, default=Path(env("XDP_PIN_DIR", str(DEFAULT_PIN_DIR)))
    )
    commands = parser.add_subparsers(dest="command", required=True)
    loading = commands.add_parser("load", help="attach the router to an interface")
    loading.add_argument("--iface", required=True)
    loading.add_argument("--config", help="JSON: cluster_id, gossip_port, api_port, peer_port")
    loading.add_argument("--cluster-id", default=env("CLUSTER_ID", "laminar"))
    for port, default in (
        ("gossip", DEFAULT_GOSSIP_PORT),
        ("api", DEFAULT_API_PORT),
        ("peer", DEFAULT_PEER_PORT),
    ):
        loading.add_argument(
            f"--{port}-port", type=int, default=int(env(f"{port.upper()}_PORT", str(default)))
        )
    loading.add_argument(
        "--object", type=Path, default=Path(env("XDP_OBJECT", str(DEFAULT_OBJECT)))
    )
    loading.add_argument("--mode", default="auto", choices=["auto", "native", "generic"])
    loading.add_argument(
        "--best-effort",
        action="store_true",
        help="where BPF is not permitted, say so and exit 0 (the broker runs without XDP)",
    )
    loading.add_argument(
        "--steer-workers", type=int, default=int(env("WORKERS", "1") or "1"),
        help="pin the steer port's program for this many workers (above 1; 0: one per usable "
        "core, as laminar serve counts them)",
    )  # fmt: skip
    loading.add_argument(
        "--steer-owner", type=int, help="the uid the steer pins belong to (the broker's)"
    )
    unloading = commands.add_parser("unload", help="detach and unpin")
    unloading.add_argument("--iface", required=True)
    commands.add_parser("stats", help="counters per class, as JSON")
    return parser


def _pin_steering(pin_dir: Path, workers: int, owner: int | None) -> None:
    """Pin the steer port's program beside the router (several workers only); a failure is
    said and leaves the router as it is."""
    workers = workers or usable_cores()
    if workers < 2:
        return
    try:
        steering.pin(pin_dir, workers, owner)
    except OSError as exc:
        print(f"laminar-xdp: the steer port's program is not pinned: {exc}", file=sys.stderr)
        return
    print(f"laminar-xdp: the steer port's program pinned for {workers} workers")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "load":
            used = load(
                args.iface, _config_from(args), obj=args.object, pin_dir=args.pin_dir,
                mode=args.mode,
            )  # fmt: skip
            print(f"laminar-xdp: router attached to {args.iface} ({used} mode)")
            _pin_steering(args.pin_dir, args.steer_workers, args.steer_owner)
        elif args.command == "unload":
            unload(args.iface, args.pin_dir)
            print(f"laminar-xdp: nothing attached to {args.iface}")
        else:
            print(json.dumps(stats(args.pin_dir), sort_keys=True))
    except NotPermitted as exc:
        print(f"laminar-xdp: not permitted: {exc}", file=sys.stderr)
        if args.command == "load" and args.best_effort:
            print("laminar-xdp: continuing without the XDP router", file=sys.stderr)
            return 0
        return EXIT_NOT_PERMITTED
    except XdpError as exc:
        print(f"laminar-xdp: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
