"""Reading YAML for the person at the keyboard: search spaces, calibration profiles and
GPU catalogs all come through :func:`read_yaml`, which refuses a damaged file (binary
junk, a runaway paste, an alias bomb, duplicate keys) in one line with file:line, and
keeps the line of every key so that a later check can point at it."""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuner.core.errors import InputError
from tuner.core.values import shown

# Search spaces, calibration profiles and GPU catalogs are read here. These limits keep a
# damaged file (binary junk, a runaway paste, an alias bomb) from costing minutes or
# gigabytes before its one-line message.
#: Bytes in one file: the shipped ones are under 10 KiB.
MAX_YAML_BYTES = 1 << 20
#: Nesting levels: the schemas use at most five.
MAX_YAML_DEPTH = 32
#: Digits of one plain number: more is a typo (and Python refuses ints of over 4,300).
MAX_NUMBER_CHARS = 100
_NUMBERISH = re.compile(r"[-+]?(0x[0-9a-fA-F_]+|0o?[0-7_]+|[0-9][0-9_:]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?|\.[0-9_]+([eE][-+]?[0-9]+)?)")  # noqa: E501


@dataclass(frozen=True, slots=True)
class YamlDoc:
    """A YAML document: its data, its path, and the 1-based line of every key path
    (``("deployment", "gpus")``; list items by position)."""

    data: Any
    path: str
    lines: dict[tuple[Any, ...], int]

    def line(self, key: Sequence[Any] = ()) -> int | None:
        """The line of ``key``, else of its nearest parent that has one."""
        return line_of(self.lines, tuple(key))


def line_of(lines: dict[tuple[Any, ...], int], key: tuple[Any, ...]) -> int | None:
    parts = tuple(str(k) for k in key)
    for n in range(len(parts), -1, -1):
        line = lines.get(parts[:n])
        if line is not None:
            return line
    return None


def read_yaml(path: str | Path, *, what: str) -> YamlDoc:
    """Read the YAML file at ``path`` (``what`` names it in messages: "search space").
    Errors are one-line :class:`InputError`s with the path and, where the text is at
    fault, the line."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"cannot read {what}: {err.strerror}", path=path) from err
    if len(raw) > MAX_YAML_BYTES:
        raise InputError(f"the {what} is {len(raw):,} bytes, more than the {MAX_YAML_BYTES:,} tuner reads "
                         "(the whole file is at fault, not one line)", path=path,
                         hint="is this the right file?")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise InputError(f"not UTF-8 text: byte 0x{raw[err.start]:02x} at column {column}", path=path,
                         line=line, hint="save the file as UTF-8") from None
    return parse_yaml(text, path=str(path), what=what)


def parse_yaml(text: str, *, path: str, what: str) -> YamlDoc:
    """:func:`read_yaml` for text already read."""
    if len(text) > MAX_YAML_BYTES:
        raise InputError(f"the {what} is {len(text):,} characters, more than the {MAX_YAML_BYTES:,} "
                         "tuner reads (the whole file is at fault, not one line)", path=path)
    try:
        node = _compose(yaml.parse(text, Loader=_LOADER))
        lines = _line_index(node)
        data = _construct(node)
    except yaml.YAMLError as err:
        raise _yaml_error(err, text, path, what) from None
    except _Refused as err:
        raise InputError(err.message, path=path, line=err.line, hint=err.hint) from None
    return YamlDoc(data, path, lines)


#: libyaml's parser when PyYAML was built with it (ten times faster), else PyYAML's own.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Refused(Exception):
    def __init__(self, message: str, line: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.line, self.hint = message, line, hint


def _compose(events: Iterator[yaml.Event]) -> yaml.Node | None:
    """The node tree of a one-document stream, built from the parser's events without
    recursion (PyYAML's composer recurses, and a deep file overflows the stack). Refuses
    nesting deeper than :data:`MAX_YAML_DEPTH` and plain numbers longer than
    :data:`MAX_NUMBER_CHARS`."""
    resolver = yaml.resolver.Resolver()
    anchors: dict[str, yaml.Node] = {}
    stack: list[list[Any]] = []  # [collection node, pending mapping key]
    root: yaml.Node | None = None
    documents = 0
    for event in events:
        line = event.start_mark.line + 1 if event.start_mark is not None else 1
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise _Refused("a second YAML document (---) in one file", line, hint="keep one document")
            continue
        if isinstance(event, (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentEndEvent)):
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            stack.pop()
            continue
        node: yaml.Node
        if isinstance(event, yaml.AliasEvent):
            if event.anchor not in anchors:
                raise _Refused(f"alias *{shown(event.anchor)} names no anchor", line)
            node = anchors[event.anchor]
        elif isinstance(event, yaml.ScalarEvent):
            if event.implicit[0] and len(event.value) > MAX_NUMBER_CHARS and _NUMBERISH.fullmatch(event.value):
                raise _Refused(f"a number of {len(event.value):,} characters, more than the "
                               f"{MAX_NUMBER_CHARS} tuner reads", line)
            tag = event.tag if event.tag not in (None, "!") else resolver.resolve(yaml.ScalarNode, event.value, event.implicit)  # noqa: E501
            node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
        else:
            kind = yaml.SequenceNode if isinstance(event, yaml.SequenceStartEvent) else yaml.MappingNode
            tag = event.tag if event.tag not in (None, "!") else resolver.resolve(kind, None, event.implicit)
            node = kind(tag, [], event.start_mark, event.end_mark, flow_style=event.flow_style)
        if getattr(event, "anchor", None) is not None and not isinstance(event, yaml.AliasEvent):
            anchors[event.anchor] = node
        if stack:
            parent = stack[-1]
            if isinstance(parent[0], yaml.SequenceNode):
                parent[0].value.append(node)
            elif parent[1] is None:
                parent[1] = node
            else:
                parent[0].value.append((parent[1], node))
                parent[1] = None
        else:
            root = node
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_YAML_DEPTH:
                raise _Refused(f"nested more than {MAX_YAML_DEPTH} levels deep", line,
                               hint="a missing closing bracket?")
            stack.append([node, None])
    return root


def _yaml_error(err: yaml.YAMLError, text: str, path: str, what: str) -> InputError:
    if isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        return InputError(f"not valid YAML: character #x{err.character:04x} is not allowed in a {what}",
                          path=path, line=line, hint="is this a text file?")
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    words = [w for w in (getattr(err, "context", None), getattr(err, "problem", None)) if w]
    message = " ".join(" ".join(words).split()) if words else "cannot parse it"
    return InputError(f"not valid YAML: {message}", path=path, line=None if mark is None else mark.line + 1,
                      hint="check indentation and colons")


def _line_index(root: yaml.Node | None) -> dict[tuple[Any, ...], int]:
    """Key path (of ``str`` parts) → 1-based line of that key; refuses a key given twice
    in one mapping. Iterative, and each node once (aliases repeat nodes)."""
    out: dict[tuple[Any, ...], int] = {}
    if root is None:
        out[()] = 1
        return out
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        out.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode):
                    stack.append((v, path + ("?",)))
                    continue
                line = k.start_mark.line + 1
                if k.value in keys and k.tag != "tag:yaml.org,2002:merge":
                    dotted = ".".join(path + (k.value,))
                    raise _Refused(f"{shown(dotted)} is given twice (lines {keys[k.value]} and {line})", line,
                                   hint="keep one")
                keys[k.value] = line
                out[path + (k.value,)] = line
                stack.append((v, path + (k.value,)))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                stack.append((v, path + (str(i),)))
    return out


def _construct(node: yaml.Node | None) -> Any:
    if node is None:
        return None
    try:
        return yaml.constructor.SafeConstructor().construct_document(node)
    except (ValueError, OverflowError, TypeError, RecursionError) as err:
        # a scalar the constructor cannot turn into a value: find which one
        stack, seen = [node], set()
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if isinstance(n, yaml.ScalarNode):
                try:
                    yaml.constructor.SafeConstructor().construct_object(n)
                except (ValueError, OverflowError, TypeError):
                    raise _Refused(f"cannot read the value {shown(n.value)}", n.start_mark.line + 1) from None
            elif isinstance(n, yaml.MappingNode):
                stack += [x for pair in n.value for x in pair]
            elif isinstance(n, yaml.SequenceNode):
                stack += n.value
        raise _Refused(f"cannot read the document: {type(err).__name__}", node.start_mark.line + 1) from None
