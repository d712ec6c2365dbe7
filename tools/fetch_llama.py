"""Build llama.cpp's `llama-server` and grammar validator (run by `make setup`).

`xpuctl ask`'s tests talk to a real OpenAI-compatible server: llama.cpp's own `llama-server`,
serving a tiny model the tests write (tools/tiny_gguf.py). llama.cpp has no prebuilt Linux
binaries on the package registries, so its source comes from the `llama-cpp-python` sdist on
PyPI (pinned, sha256-checked), which vendors a llama.cpp tree; two targets are built from it
with Debian's cmake: `llama-server` and `test-gbnf-validator` (llama.cpp's own grammar parser
and matcher, which the grammar tests run MiniLang programs through). CPU only, no network
features, portable code (GGML_NATIVE off), static libraries, -O1: about 4.5 CPU-minutes
(2.5 minutes on two idle cores).

The binaries land in DEST/bin; a stamp records the source they were built from, so a second
run does nothing. The build directory is removed afterwards (it is ~300 MB).
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

PACKAGE = "llama_cpp_python"
VERSION = "0.3.36"
URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz"
)
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TARGETS = ["llama-server", "test-gbnf-validator"]
OPT = "-O1 -DNDEBUG"


def download(dest):
    with urllib.request.urlopen(URL, timeout=600) as r:
        data = r.read()
    got = hashlib.sha256(data).hexdigest()
    if got != SHA256:
        sys.exit(f"llama.cpp: {URL}: sha256 mismatch (got {got}, pinned {SHA256})")
    with open(dest, "wb") as f:
        f.write(data)


def build(src, build_dir, jobs):
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        # -O1: a third less compile time than -O3 (4.4 against 7.1 CPU-minutes here); the
        # tests' tiny model answers an ask in 2.9 s instead of 2.1.
        f"-DCMAKE_C_FLAGS_RELEASE={OPT}",
        f"-DCMAKE_CXX_FLAGS_RELEASE={OPT}",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DGGML_NATIVE=OFF",
        "-DLLAMA_BUILD_TESTS=ON",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ]
    subprocess.run(["cmake", "-S", src, "-B", build_dir, *flags], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["cmake", "--build", build_dir, "-j", str(jobs), "--target", *TARGETS],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main(dest):
    stamp = os.path.join(dest, ".stamp")
    want = f"{PACKAGE}=={VERSION} {' '.join(TARGETS)} {OPT}"
    bins = [os.path.join(dest, "bin", t) for t in TARGETS]
    if all(os.path.exists(b) for b in bins) and os.path.exists(stamp) and open(stamp).read().strip() == want:
        print(f"llama.cpp: up to date in {dest}")
        return
    if shutil.which("cmake") is None:
        sys.exit("llama.cpp: cmake is missing (make setup-apt installs it)")
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as work:
        tarball = os.path.join(work, "src.tar.gz")
        print(f"llama.cpp: fetching {PACKAGE} {VERSION} and building {', '.join(TARGETS)} (a few minutes)")
        download(tarball)
        with tarfile.open(tarball) as t:
            t.extractall(work, filter="data")
        src = os.path.join(work, f"{PACKAGE}-{VERSION}", "vendor", "llama.cpp")
        build_dir = os.path.join(work, "build")
        build(src, build_dir, os.cpu_count() or 2)
        os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
        for t, b in zip(TARGETS, bins):
            shutil.copy2(os.path.join(build_dir, "bin", t), b)
    with open(stamp, "w") as f:
        f.write(want + "\n")
    print(f"llama.cpp: {', '.join(TARGETS)} in {os.path.join(dest, 'bin')}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: fetch_llama.py DEST")
    main(sys.argv[1])
