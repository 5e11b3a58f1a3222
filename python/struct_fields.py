"""The data members of the public C++ structs, read from the headers themselves: the one field
list the Python bindings are generated from (at build: `python struct_fields.py OUT`) and the
drift test checks against. A field added to a struct in C++ appears in Python with no second
edit."""

import re
import sys
from pathlib import Path

INCLUDE = Path(__file__).resolve().parents[1] / "include" / "hybridkv"
FIELD = re.compile(r"^\s*(?:std::[\w:]+<[^;()]*>|[\w:]+)\s+(\w+)\s*(?:=[^;()]*|\{[^;()]*\})?;")

# The result structs converted to dicts (header, struct), nested ones included.
DICT_STRUCTS = [
    ("stats.h", "GroupIterationStats"),
    ("stats.h", "TierIterationStats"),
    ("stats.h", "IterationStats"),
    ("reuse.h", "GroupReuseStats"),
    ("reuse.h", "ReuseStats"),
    ("shared_store.h", "SharedTierStats"),
    ("shared_store.h", "SharedFetch"),
    ("engine_memory.h", "EngineCopyList"),
    ("engine_memory.h", "EngineCopyBatch"),
]


def fields(header, struct):
    """The data members of `struct` in `header`, in order (methods and comments skipped)."""
    text = (INCLUDE / header).read_text()
    start = text.index(f"struct {struct} {{")
    body = text[text.index("{", start) + 1:text.index("\n};", start)]
    out = []
    for line in body.splitlines():
        line = line.split("//")[0]
        m = FIELD.match(line)
        if m and "(" not in line:
            out.append(m.group(1))
    assert out, f"no fields found in {header}: {struct}"
    return out


def generate():
    """C++ (python/src/dicts.h's to_py) turning each result struct into a dict, every field."""
    lines = ["// Generated at build by python/struct_fields.py from the public headers: do not edit.",
             "#pragma once", ""]
    for header, struct in DICT_STRUCTS:
        lines.append(f"inline nanobind::dict to_py(const {struct}& s) {{")
        lines.append("  nanobind::dict d;")
        for f in fields(header, struct):
            lines.append(f'  d["{f}"] = to_py(s.{f});')
        lines.append("  return d;")
        lines.append("}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    text = generate()
    if not out.exists() or out.read_text() != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
