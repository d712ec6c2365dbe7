"""Fetch the runtime libraries engines load at run time (run by `make setup`).

The wheels `onnxruntime==1.31.1`, `openvino==2026.4.1` and `scipy-openblas32` (the OpenBLAS
numpy ships, which knows current CPUs) come from the Python registry; their shared
libraries are extracted into DEPS (git-ignored):

  DEPS/onnxruntime/libonnxruntime.so          (-> libonnxruntime.so.1.31.1)
  DEPS/openvino/libopenvino_c.so              (-> libopenvino_c.so.2641, plus the core,
                                               plugins, frontends and TBB it loads)
  DEPS/openblas/libscipy_openblas.so          (the cpu engine's `cpu.blas`)

Idempotent: a stamp file per library set records the wheel it came from.
"""

import os
import subprocess
import sys
import zipfile

# The cpu engine's OpenBLAS, pinned (its version is an engine fact of every run that uses it).
OPENBLAS = "scipy-openblas32==0.3.34.481.3"

WHEELS = {
    "onnxruntime": ("onnxruntime==1.31.1", "onnxruntime/capi/", ["libonnxruntime.so.1.31.1", "libonnxruntime_providers_shared.so"]),
    "openvino": ("openvino==2026.4.1", "openvino/libs/", None),  # None: every library in the folder
    "openblas": (OPENBLAS, "scipy_openblas32/lib/", ["libscipy_openblas.so"]),
}
# Unversioned names the engines open (what a linker's -l would find).
LINKS = {
    "onnxruntime": {"libonnxruntime.so": "libonnxruntime.so.1.31.1"},
    "openvino": {"libopenvino_c.so": "libopenvino_c.so.2641", "libopenvino.so": "libopenvino.so.2641"},
    "openblas": {},
}


def main(deps):
    wheels = os.path.join(deps, "wheels")
    os.makedirs(wheels, exist_ok=True)
    for name, (req, prefix, files) in WHEELS.items():
        out = os.path.join(deps, name)
        stamp = os.path.join(out, ".stamp")
        if os.path.exists(stamp) and open(stamp).read().strip() == req:
            print(f"{name}: up to date in {out}")
            continue
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", req, "-d", wheels],
            check=True,
        )
        project, version = req.split("==")
        # Wheel file names spell the project with underscores (scipy_openblas32-0.3…).
        stem = f"{project.replace('-', '_')}-{version}"
        wheel = next(
            os.path.join(wheels, f) for f in sorted(os.listdir(wheels)) if f.startswith(stem) and f.endswith(".whl")
        )
        os.makedirs(out, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if not member.startswith(prefix) or member.endswith("/"):
                    continue
                base = member[len(prefix):]
                if "/" in base or ".so" not in base:
                    continue
                if files is not None and base not in files:
                    continue
                target = os.path.join(out, base)
                with z.open(member) as src, open(target + ".tmp", "wb") as dst:
                    dst.write(src.read())
                os.chmod(target + ".tmp", 0o755)
                os.replace(target + ".tmp", target)
        for link, target in LINKS[name].items():
            path = os.path.join(out, link)
            if os.path.lexists(path):
                os.remove(path)
            os.symlink(target, path)
        with open(stamp, "w") as f:
            f.write(req + "\n")
        print(f"{name}: {req} extracted into {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".deps")
