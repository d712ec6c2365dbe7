"""Prunes stale build output from the persistent cargo target dir (`make prune`).

The target dir lives outside the clone and persists between CI runs, so it only grows:
every change to a dependency's features or version gives the workspace crates new
metadata hashes, and the old artifacts stay beside the new ones (one crate held 13 copies
after a day of sessions). This removes:

- each profile's `incremental/` caches (an optimisation only: a crate rebuilds without
  them; they do not make a fresh crate rebuild);
- for every workspace unit (a package's library, test, binary, …), the builds older than
  its newest build by more than `--window-hours` — their `.fingerprint/<package>-<hash>`
  and `deps/*-<hash>*` files: builds no current configuration uses.

Third-party artifacts are kept (they are rebuilt rarely and cost a cold build to lose).

    python3 tools/prune_target.py TARGET_DIR [--window-hours 2] [--dry-run]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ARTIFACT = re.compile(r"^(?:lib)?[A-Za-z0-9_]+-(?P<hash>[0-9a-f]{16})(?:\..+)?$")

def workspace_packages():
    """Names of the workspace's packages (as `.fingerprint/<package>-<hash>` spells them)."""
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        check=True, capture_output=True, text=True,
    ).stdout
    return {p["name"] for p in json.loads(out)["packages"]}


def size_of(path):
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs
                   if not os.path.islink(os.path.join(r, f)))
    return os.path.getsize(path)


def remove(path, dry):
    freed = size_of(path)
    if not dry:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    return freed


def stale_hashes(fingerprints, packages, window):
    """Hashes of workspace units older than the newest unit of the same kind.

    A unit is `.fingerprint/<package>-<hash>/`, its kind the package and the unit file in it
    (`lib-xpu_ir`, `test-integration-test-engine`, …: two packages' `engine` tests differ);
    its age the mtime of `invoked.timestamp`, written when the unit is compiled.
    """
    units = {}
    for d in os.listdir(fingerprints):
        package, _, h = d.rpartition("-")
        stamp = os.path.join(fingerprints, d, "invoked.timestamp")
        if package not in packages or not os.path.exists(stamp):
            continue
        kinds = sorted(f for f in os.listdir(os.path.join(fingerprints, d))
                       if not f.startswith(("dep-", "invoked", "output-")) and not f.endswith(".json"))
        units.setdefault((package, tuple(kinds)), []).append((os.path.getmtime(stamp), h))
    for members in units.values():
        newest = max(t for t, _ in members)
        yield from (h for t, h in members if t < newest - window)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("--window-hours", type=float, default=2.0)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    packages = workspace_packages()
    freed = 0
    for profile in ("debug", "release"):
        root = os.path.join(a.target, profile)
        if not os.path.isdir(root):
            continue
        inc = os.path.join(root, "incremental")
        if os.path.isdir(inc):
            freed += remove(inc, a.dry_run)
        fingerprints = os.path.join(root, ".fingerprint")
        if not os.path.isdir(fingerprints):
            continue
        stale = set(stale_hashes(fingerprints, packages, a.window_hours * 3600))
        for d in os.listdir(fingerprints):
            if d.rpartition("-")[2] in stale:
                freed += remove(os.path.join(fingerprints, d), a.dry_run)
        deps = os.path.join(root, "deps")
        for f in os.listdir(deps) if os.path.isdir(deps) else []:
            m = ARTIFACT.match(f)
            if m and m["hash"] in stale:
                freed += remove(os.path.join(deps, f), a.dry_run)
    verb = "would free" if a.dry_run else "freed"
    print(f"prune_target: {verb} {freed / 1e9:.1f} GB in {a.target}")


if __name__ == "__main__":
    sys.exit(main())
