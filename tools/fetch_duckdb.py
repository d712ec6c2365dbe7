"""Fetch DuckDB's prebuilt shared library (run by `make setup`).

DuckDB's C API library, `libduckdb.so`, as DuckDB's own CI builds it, ships in the npm package
`@duckdb/node-bindings-linux-x64`. The `duckdb` crate is pinned to the matching release
(`=1.10506.0`, DuckDB v1.5.6) and linked against this library instead of compiling DuckDB's
C++ from source (`bundled`), which took 20-35 minutes on 2 cores. The library has the parquet,
json and icu extensions statically linked; `xpu-store`'s tests check its version and them.

The tarball's sha512 is pinned below (npm's `integrity`); a mismatch is an error. The library
lands in DEST (the Makefile passes `$CARGO_TARGET_DIR/duckdb`, where binaries find it through
their `$ORIGIN`-relative rpath, see `.cargo/config.toml`). Idempotent: a stamp file records
the package it came from.
"""

import base64
import hashlib
import io
import os
import sys
import tarfile
import urllib.request

PACKAGE = "@duckdb/node-bindings-linux-x64"
VERSION = "1.5.6-r.1"
URL = "https://registry.npmjs.org/@duckdb/node-bindings-linux-x64/-/node-bindings-linux-x64-1.5.6-r.1.tgz"
INTEGRITY = "sha512-IXcrZJE6kEqM0Z4wwdVnGBHX/frOS33VPNAwDXQ/Q+Fs84b058Qe94chrCCIcNJlG8Y3UHIUU4eBeCQxW5mN1Q=="


def main(dest):
    stamp = os.path.join(dest, ".stamp")
    want = f"{PACKAGE}@{VERSION}"
    lib = os.path.join(dest, "libduckdb.so")
    if os.path.exists(lib) and os.path.exists(stamp) and open(stamp).read().strip() == want:
        print(f"duckdb: up to date in {dest}")
        return
    with urllib.request.urlopen(URL, timeout=300) as r:
        data = r.read()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != INTEGRITY:
        sys.exit(f"duckdb: {URL}: integrity mismatch (got {digest}, pinned {INTEGRITY})")
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for name in ("libduckdb.so", "LICENSE"):
            member = tar.getmember(f"package/{name}")
            target = os.path.join(dest, name)
            with tar.extractfile(member) as src, open(target + ".tmp", "wb") as dst:
                dst.write(src.read())
            os.chmod(target + ".tmp", 0o755 if name.endswith(".so") else 0o644)
            os.replace(target + ".tmp", target)
    with open(stamp, "w") as f:
        f.write(want + "\n")
    print(f"duckdb: {want} extracted into {dest}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: fetch_duckdb.py DEST")
    main(sys.argv[1])
