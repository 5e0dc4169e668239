"""YAML as a study spec is read: ``1e-3`` a number, a repeated key an error, a size limit, the
file's encoding found from its byte-order mark."""
from __future__ import annotations

import re
from pathlib import Path

import yaml


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` as a string (its floats need a dot); grids are full of them.
    A key given twice in one mapping is an error (YAML would keep the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == \
                        "tag:yaml.org,2002:merge":
                    continue
                key = key_node.value
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (lines {seen[key] + 1} and "
                        f"{key_node.start_mark.line + 1}); YAML would keep only the last",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


#: the most values a spec may hold, aliases counted each time they are used (a YAML "billion
#: laughs" document of nested aliases is small as text and enormous as values)
MAX_SPEC_VALUES = 1_000_000


def _check_size(value, where: str, what: str = "a study spec") -> None:
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > MAX_SPEC_VALUES:
            raise ValueError(f"{where}: holds more than {MAX_SPEC_VALUES} values (aliases "
                             f"counted each time they are used); not {what}")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def read_spec_text(path) -> str:
    """A spec file's text: UTF-8 (with or without a byte-order mark), or UTF-16 / UTF-32 with
    one (what some Windows editors save); anything else is a ``ValueError`` naming the file."""
    import codecs

    data = Path(path).read_bytes()
    codec = next((c for bom, c in ((codecs.BOM_UTF32_LE, "utf-32"),
                                   (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
                                   (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
                  if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(codec)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not {codec.upper().replace('-SIG', '')} text (byte "
                         f"{data[err.start:err.start + 1]!r} at offset {err.start}); save the "
                         f"spec as UTF-8") from None
    if "\x00" in text:
        raise ValueError(f"{path}: holds NUL characters, not a text file (UTF-16 without a "
                         f"byte-order mark?); save the spec as UTF-8")
    return text


def parse_yaml(text: str, where: str = "<text>", what: str = "a study spec"):
    """YAML ``text`` (with ``1e-3`` as a number; a key given twice refused); ``ValueError``
    naming ``where`` and the line; ``what`` the text is meant to be, for the messages."""
    try:
        value = yaml.load(text, Loader=_Loader)
        _check_size(value, where, what)
        return value
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply to be {what}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f", line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{where}{at}: not valid YAML ({getattr(err, 'problem', None) or err})") \
            from None

