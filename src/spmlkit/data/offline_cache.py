"""The cache of the sets built once from a package that a registry carries, so that they need
no download at run time: `fmnist_mosaic` (Debian's
``dataset-fashion-mnist``) and `mdi_icons` (npm's ``@mdi/svg``), each in
its own module.

The cache folder is ``cache_dir`` if given, else ``$SPMLKIT_CACHE``, else ``~/.cache/spmlkit``;
each build goes into ``<cache>/<key>/`` where the key names every parameter that changes the
files, with a ``manifest.json`` that records those parameters. A build is written into a
temporary folder next to it and renamed into place, so an interrupted build never leaves a
half-written set behind, and two processes building the same set at once both end up using one
complete copy.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["FORMAT_VERSION", "build_atomically", "cache_root", "check_files", "read_manifest",
           "write_manifest"]

FORMAT_VERSION = 1           # bump when the files a build writes change


def cache_root(cache_dir=None) -> Path:
    """``cache_dir``, else ``$SPMLKIT_CACHE``, else ``~/.cache/spmlkit``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SPMLKIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spmlkit"


def build_atomically(final: Path, build) -> None:
    """Run ``build(tmp_folder)`` and rename the folder to ``final``; if another process put a
    complete ``final`` there first, keep that one and drop ours."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)                      # mkdtemp makes it private
        try:
            os.rename(tmp, final)
        except OSError as err:
            if not (final / "manifest.json").is_file():
                raise OSError(f"cannot move the built set into {final} ({err}); if that folder "
                              f"exists without a manifest.json it is an incomplete copy: "
                              f"delete it and load again") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_manifest(folder: Path, params: dict) -> dict | None:
    """The manifest of a complete cached build with these parameters, else None."""
    path = folder / "manifest.json"
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable cache manifest ({err}); delete the folder "
                         f"{folder} to rebuild it") from None
    if manifest.get("params") != params:
        raise ValueError(f"{path}: the cached set was built with {manifest.get('params')}, "
                         f"not {params}; delete the folder {folder} to rebuild it")
    return manifest


def check_files(folder: Path, names: list[str]) -> list[str]:
    paths = [str(folder / n) for n in names]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"{missing[0]} (and {len(missing) - 1} more) missing from the "
                                f"cached set {folder}; delete that folder to rebuild it")
    return paths


def write_manifest(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
