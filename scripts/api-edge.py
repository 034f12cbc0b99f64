#!/usr/bin/env python3
"""The user-facing crates' public API names no cudarc type (CI runs it after the docs).

`zenoh-cuda-shm` and `zenoh-cuda-shm-ros2` are the crates applications use; cudarc is
an implementation detail below them (its version may change without theirs). This
documents both crates (and those they re-export whole) together with cudarc, so that rustdoc links every cudarc type it
meets in a signature, a field, a trait impl or a re-export (inlined or not) to cudarc's
pages, then fails when any page of these crates mentions `cudarc`: a link, a type's
title, or prose.

Items of the layer crates that only those crates use carry `#[doc(hidden)]`, which
rustdoc leaves out of the pages and so out of this check.

Usage: scripts/api-edge.py   (from anywhere in the repository)
"""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATES = ["zenoh-cuda-shm", "zenoh-cuda-shm-ros2"]
# Crates that `zenoh-cuda-shm` re-exports whole (`pub use zcs_provider as provider`,
# `pub use tensor_codec`): rustdoc links to their own pages instead of inlining them.
WHOLE = ["zcs-provider", "tensor-codec"]
# What an item's signature shows for a cudarc type: `title="struct cudarc::…"` and a
# link into cudarc's pages; prose naming the crate is caught too.
MENTION = re.compile(r"cudarc")
TITLE = re.compile(r'title="[a-z ]*(cudarc::[^"]*)"')


def target_dir():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return pathlib.Path(json.loads(out)["target_directory"])


def document():
    args = ["cargo", "doc", "--no-deps", "--locked", "-q", "-p", "cudarc"]
    for c in CRATES + WHOLE:
        args += ["-p", c]
    subprocess.run(args, cwd=ROOT, check=True)


def leaks(doc):
    found = []
    for crate in CRATES + WHOLE:
        pages = doc / crate.replace("-", "_")
        if not pages.is_dir():
            sys.exit(f"api-edge: no pages for {crate} under {doc}")
        for page in sorted(pages.rglob("*.html")):
            text = page.read_text(encoding="utf-8", errors="replace")
            if not MENTION.search(text):
                continue
            types = sorted(set(TITLE.findall(text))) or ["(the word `cudarc` in the page)"]
            found.append((page.relative_to(doc), types))
    return found


def main():
    document()
    found = leaks(target_dir() / "doc")
    if not found:
        print(f"api-edge: no cudarc type in the public API of {', '.join(CRATES + WHOLE)}")
        return 0
    print(f"api-edge: {len(found)} page(s) of the public API mention cudarc:", file=sys.stderr)
    for page, types in found:
        print(f"  {page}: {', '.join(types)}", file=sys.stderr)
    print(
        "Give users a type of ours (zcs-memory wraps cudarc), or mark an item the layer "
        "crates alone use #[doc(hidden)].",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
