"""A tei.v1 client as a TEI user makes one: Python modules generated from a tei.proto by grpcio-tools. TEI_PROTO names
TEI's own file (proto/tei.proto of huggingface/text-embeddings-inference, which CI cannot download); without it, the
server's own copy, which tests/test_grpc.py holds to TEI's names and numbers wherever TEI_PROTO is given."""
from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType

OURS = Path(__file__).resolve().parents[1] / "infinity" / "grpc" / "tei.proto"


def proto() -> Path:
    return Path(os.environ.get("TEI_PROTO") or OURS)


@cache
def generated() -> tuple[ModuleType, ModuleType]:
    """(tei_pb2, tei_pb2_grpc), generated once per process into a folder of its own."""
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix="tei-client-"))
    shutil.copy(proto(), out / "tei.proto")
    assert protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                        str(out / "tei.proto")]) == 0
    sys.path.insert(0, str(out))
    return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")
