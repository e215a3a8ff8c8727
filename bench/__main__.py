"""`python -m bench SUITE [ARGS...]`: every benchmark, and the servers and tools they start, from one entry.
`python -m bench` lists the suites; `python -m bench SUITE --help` gives one suite's options (bench/README.md)."""
from __future__ import annotations

import importlib
import sys

# suite -> its module under bench/, each with a main() that reads sys.argv
SUITES = {
    "run": "run", "short": "short", "lane": "lane", "abuse": "abuse", "recipes": "recipes",
    "checkpoint": "checkpoint", "memory": "memory", "coldstart": "coldstart", "replicas": "replicas",
    "queue": "queue_depth", "efficiency": "efficiency", "profile": "kernels", "bulk": "bulk", "peer": "peer",
    "corpus": "corpus", "cores": "cores", "shapes": "shapes", "overhead": "overhead",
    "engine-sweep": "engine_sweep", "bare": "bare", "vanilla-server": "vanilla_server", "model": "model",
    "library": "library", "openvino": "openvino_peer", "grpc": "grpc_load",
}


def summary(name: str) -> str:
    """The first sentence of the suite's docstring."""
    doc = importlib.import_module(f"bench.{SUITES[name]}").__doc__ or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = paragraph.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 100 else sentence[:100].rsplit(" ", 1)[0] + " ..."


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.splitlines()[0] + "\n")
        for name in SUITES:
            print(f"  {name:<15} {summary(name)}")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUITES:
        print(f"python -m bench: no suite {name!r}; choose one of {', '.join(SUITES)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{SUITES[name]}")
    sys.argv = [f"python -m bench {name}", *rest]
    status = module.main()
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
