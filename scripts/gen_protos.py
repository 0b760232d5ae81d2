#!/usr/bin/env python3
"""Generate the Python code for every .proto under protos/ into the jetstream package.

Usage: python scripts/gen_protos.py [--out DIR]

protos/jetstream/v1/x.proto becomes jetstream/v1/x_pb2.py (+ .pyi and _pb2_grpc.py), so the
generated imports (``from jetstream.v1 import x_pb2``) resolve inside our own package. The
output is committed; tests/test_protos.py checks it is current.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"


def generate(out: Path) -> list[Path]:
    """Run protoc over every proto file; return the files it wrote."""
    from grpc_tools import protoc

    sources = sorted(p.relative_to(PROTOS).as_posix() for p in PROTOS.rglob("*.proto"))
    include = str(resources.files("grpc_tools") / "_proto")
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *sources]
    if protoc.main(args) != 0:
        msg = f"protoc failed on {', '.join(sources)}"
        raise SystemExit(msg)
    stems = [out / source.removesuffix(".proto") for source in sources]
    return [Path(f"{stem}{suffix}") for stem in stems
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo)")
    written = generate(parser.parse_args().out)
    print(f"generated {len(written)} files", file=sys.stderr)


if __name__ == "__main__":
    main()
