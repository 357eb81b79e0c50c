"""The wheels `make gpu-check` needs on a device without network (`make gpu-check-bundle`).

A lent GPU machine has torch (with its own dependencies and numpy) but not the libraries the
trainer's code path imports, and it cannot reach a package index. This downloads, for a generic
x86_64 Linux and each CPython in `--python` (the project needs >= 3.11), exactly the distributions
that bench/gpu_check.py imports besides torch's stack, each pinned to the version installed here (the
versions the CPU mode is tested with), into one directory, with `requirements.txt` listing the pins:
bench/gpu_check.sh installs them with `pip --no-index --no-deps` next to the image's torch.

The list is what `python -X importtime bench/gpu_check.py --device cpu` shows is imported, without
what is only imported when present (Pillow, psutil, cryptography, hiredis, xxhash, opentelemetry: a
bare environment with the bundle alone runs the check). Distributions that ship an abi3 or pure
wheel are downloaded once; pydantic-core, PyYAML and regex once per Python. numpy is left to the
image: every torch image has it, and its wheels (~17 MB per Python) would not fit the carry limit.

The last line is `RESULT wheels=… size_mib=… pythons=…`; exit status 1 when a download fails or
the directory exceeds `--max-mib`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

# distribution: why the check imports it
PACKAGES = {
    "transformers": "Qwen2ForCausalLM and save_pretrained (model.py, publish.py)",
    "huggingface-hub": "imported by transformers",
    "safetensors": "the weights snapshot (publish.py)",
    "tokenizers": "imported by transformers' Qwen2 module",
    "regex": "transformers' import-time version check",
    "tqdm": "transformers' import-time version check",
    "packaging": "transformers' import-time version check",
    "filelock": "transformers' import-time version check (torch's may be older)",
    "pyyaml": "transformers' import-time version check; asyncdapo.contracts.config",
    "httpx2": "huggingface-hub's HTTP client, imported with it",
    "httpcore2": "httpx2",
    "anyio": "httpx2",
    "h11": "httpcore2",
    "idna": "httpx2",
    "truststore": "httpx2",
    "pydantic": "asyncdapo.contracts.config (RunConfig)",
    "pydantic-core": "pydantic",
    "annotated-types": "pydantic",
    "typing-inspection": "pydantic",
    "typing-extensions": "pydantic (needs a newer one than torch's images may have)",
    "protobuf": "asyncdapo.v1 (the Group messages batches are built from)",
    "redis": "imported by publish.py (fence, Redis I/O)",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def pins() -> list[str]:
    """`name==version` of every package, as installed in this environment."""
    out = []
    for name in PACKAGES:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"gpu-bundle: {name} is not installed here; run `make install` first") from None
    return out


def download(requirements: list[str], python: str, dest: Path) -> None:
    tag = python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
           "--implementation", "cp", "--python-version", python, "--abi", f"cp{tag}", "--abi", "abi3",
           "--abi", "none", "--dest", str(dest)]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *requirements], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default="build/gpu-wheels")
    ap.add_argument(
        "--python", default="3.11,3.12,3.13", help="CPython versions of the device, comma-separated"
    )
    ap.add_argument(
        "--max-mib", type=float, default=60.0, help="fail above this size (the carry limit is 64 MiB)"
    )
    args = ap.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    requirements = pins()
    pythons = args.python.split(",")
    for python in pythons:
        print(f"gpu-bundle: CPython {python}", flush=True)
        download(requirements, python, dest)
    (dest / "requirements.txt").write_text("\n".join(requirements) + "\n")
    wanted = {r.split("==")[0].replace("-", "_").lower() for r in requirements}
    stale = [w for w in dest.glob("*.whl") if w.name.split("-")[0].lower() not in wanted]
    for w in stale:  # from an earlier list
        w.unlink()
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / (1 << 20)
    for w in wheels:
        print(f"  {w.stat().st_size / (1 << 20):6.2f} MiB  {w.name}")
    print(f"gpu-bundle: {len(wheels)} wheels, {size:.1f} MiB in {dest} (limit {args.max_mib:g} MiB)")
    print(f"RESULT wheels={len(wheels)} size_mib={size:.1f} pythons={','.join(pythons)}")
    if size > args.max_mib:
        print(f"gpu-bundle: {size:.1f} MiB exceeds --max-mib {args.max_mib:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
