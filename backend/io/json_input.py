"""Reading and decoding user-supplied JSON (scenario files, snapshots, uploads) as data only."""

from __future__ import annotations

import argparse
import codecs
import json
import os
import re
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backend.core.checks import MAX_JSON_INT, check_int, shown, written_as_float
from backend.core.errors import PagedLabError

# Control characters JSON has nowhere unescaped, not even inside a string.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _control_problem(exc: json.JSONDecodeError) -> str | None:
    """Why text that failed to parse is no JSON file, where a control character says it
    better than the parser's "Expecting value: line 1 column 1 (char 0)": a NUL anywhere
    (no text file has one: a tar archive, a file of zeros, UTF-8 that is not text), or
    another control character where parsing stopped (an escape pasted from a
    terminal). None: the parser's own words stand."""
    doc = exc.doc
    nul = doc.find("\x00")        # memchr: cheap on a 32 MiB file
    # The parser stops at the first unescaped control character it meets, in a string
    # or out of one, so only the one where it stopped needs looking at.
    found = _CONTROL.match(doc, exc.pos) if nul < 0 else None
    at = nul if nul >= 0 else (found.start() if found is not None else -1)
    if at < 0:
        return None
    line = doc.count("\n", 0, at) + 1
    column = at - (doc.rfind("\n", 0, at) + 1) + 1
    said = (f"it holds the control character U+{ord(doc[at]):04X} at line {line:,} column "
            f"{column:,}, which no JSON text has")
    return said + ("; it may be a binary file" if nul >= 0 else "")


def _encoding_name(codec: str) -> str:
    """"utf-16-be" as people write it: "UTF-16-BE"."""
    return codec.upper().replace("UTF", "UTF-", 1).replace("--", "-")


def decode_json(data: str | bytes, what: str) -> Any:
    """`json.loads`, with every way a file can fail to be JSON as one PagedLabError.

    JSONDecodeError is text that is not JSON; another ValueError, an integer too
    long to convert; RecursionError, arrays nested deeper than the parser goes. `what` names the
    input in the message ("snapshot", "scenario 'x.json'"), which ends without a full stop
    or question mark, so that callers can add a sentence after it.
    """
    if not (data.strip(b" \t\n\r") if isinstance(data, bytes) else data.strip(" \t\n\r")):
        # JSON's own white space alone. The parser's "Expecting value: line 1 column 1
        # (char 0)" reads as a typo.
        raise PagedLabError(f"{what} is empty: it holds no JSON")
    try:
        return json.loads(data, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as exc:
        key = exc.key if len(exc.key) <= _KEY_SHOWN else exc.key[:_KEY_SHOWN] + "..."
        raise PagedLabError(f"{what} is ambiguous: an object in it names {key!r} twice "
                            "(JSON readers differ on which one counts)") from None
    except UnicodeDecodeError as exc:
        # Said in words: "'utf-8' codec can't decode byte 0x89" tells no one the file
        # is binary (an image, an archive) rather than a JSON file. A statement, not a
        # question: callers go on after it ("...; it may be a binary file. The
        # playground is unchanged.").
        byte = exc.object[exc.start]
        if not exc.encoding.startswith("utf-8"):
            # json.loads reads UTF-16 or UTF-32 where the first bytes say so (a byte-order
            # mark, or zero bytes): it is that reading that failed, not UTF-8.
            raise PagedLabError(f"{what} is not valid JSON: its first bytes mark it as "
                                f"{_encoding_name(exc.encoding)} text, which it is not; it "
                                "may be a binary file, or else save it as UTF-8") from None
        # Offsets count from after a byte-order mark, which the codec strips first.
        bom = isinstance(data, bytes) and data.startswith(codecs.BOM_UTF8)
        at = exc.start + (len(codecs.BOM_UTF8) if bom else 0)
        raise PagedLabError(f"{what} is not valid JSON: it is not UTF-8 text (byte "
                            f"0x{byte:02x} at offset {at:,}); it may be a binary file"
                            ) from None
    except json.JSONDecodeError as exc:
        problem = _control_problem(exc) or str(exc)
        encoding = json.detect_encoding(data) if isinstance(data, bytes) else "utf-8"
        if encoding.startswith("utf-8"):
            raise PagedLabError(f"{what} is not valid JSON: {problem}") from None
        if data[:1] == b"\x00":
            # The reader took a file that begins with a zero byte for UTF-16 or UTF-32
            # (no JSON text written as UTF-8 does), and what it read is no JSON: a binary
            # file, most likely, of which the text read (a U+0001, say) tells nothing.
            raise PagedLabError(
                f"{what} is not valid JSON: its first bytes mark it as "
                f"{_encoding_name(encoding)} text, and read as that, "
                f"{problem.removesuffix('; it may be a binary file')}; it may be a binary "
                "file, or else save it as UTF-8") from None
        # UTF-16 or UTF-32 text (a byte-order mark, as Windows' "Unicode" saves it): read
        # as such, with a mistake of its own to mend.
        raise PagedLabError(f"{what} is not valid JSON (read as {_encoding_name(encoding)} "
                            f"text): {problem}") from None
    except RecursionError:
        # Python's words ("maximum recursion depth exceeded while decoding a JSON array
        # from a unicode string") say how the reader failed, not what is in the file.
        raise PagedLabError(f"{what} nests arrays or objects deeper than PagedLab reads "
                            "(no file of PagedLab's nests more than a few levels)") from None
    except ValueError:
        # The one other ValueError: an integer longer than Python converts (its message
        # advises a call to sys.set_int_max_str_digits, which no user can make).
        raise PagedLabError(
            f"{what} holds an integer of more than {sys.get_int_max_str_digits():,} digits; "
            "no field takes one that long") from None


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's dict, refusing a key named twice: json.loads would keep the last one
    silently, so `{"steps": [...], "steps": []}` would run no steps and say nothing."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return out


def _special_kind(mode: int) -> str | None:
    """What a file of this mode is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def path_arg(text: str) -> Path:
    """A command-line argument naming a file or folder, for argparse's `type=`: an empty
    one is refused, where Path("") would be the current folder (`--snapshots ''` wrote
    step files into it, and `--out ''` failed only after the whole run)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file or folder")
    return Path(text)


def same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one existing file: an output named after an input would
    replace it. A missing or unreadable one is no match (its own read says so)."""
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def read_bounded(path: Path, what: str, limit: int) -> bytes:
    """A regular file's bytes, at most `limit` of them; anything else is a PagedLabError.

    The reported size is only a first check: a device or pipe reports 0 and
    may never end (/dev/zero), a FIFO without a writer blocks the open, and a
    file may grow after it is measured. So only regular files are read, the
    open never waits (O_NONBLOCK), and at most limit + 1 bytes are read.
    `what` names the file in messages ("scenario").
    """
    name = f"{what} {str(path)!r}"

    def refuse_special(mode: int) -> None:
        kind = _special_kind(mode)
        if kind is not None:
            raise PagedLabError(f"cannot read {name}: it is {kind}, not a regular file")

    try:
        # stat first, so a device is never even opened (opening some has effects).
        refuse_special(path.stat().st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PagedLabError(f"cannot read {name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            info = os.fstat(fd)
            refuse_special(info.st_mode)  # it may have been replaced since the stat
            if info.st_size > limit:
                raise PagedLabError(
                    f"{name} is {info.st_size:,} bytes; the limit is {limit:,} bytes")
            data = f.read(limit + 1)
        except OSError as exc:
            raise PagedLabError(f"cannot read {name}: {exc.strerror}") from None
    if len(data) > limit:
        raise PagedLabError(
            f"{name} is more than {limit:,} bytes; the limit is {limit:,} bytes")
    return data


class FieldReader:
    """Typed field access to a decoded JSON object; every malformed value is a PagedLabError.

    `where` names the object in messages (\"snapshot.config\"). A reader remembers
    each key asked for (`get`, or `accept` for one read some other way), and the
    readers made from it (`child`, `object`, `objects`) share that record with it,
    so once a whole file is read, the first reader's `unread` lists by path every
    key of every object read that nothing asked for: a misspelt field, or one a
    newer PagedLab writes.
    The contract lets a file carry such fields, so they are not refused; the
    caller says they were ignored.
    """

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where
        self.asked: set[str] = set()
        # Every reader of one file, by the identity of the object it reads: a second
        # reader of an object is the first one, so one record says what was read of it.
        self._family: dict[int, FieldReader] = {id(data): self}

    def child(self, data: dict[str, Any], where: str) -> FieldReader:
        """A reader of `data`, an object inside this one, sharing this one's record (the
        reader already made for `data`, if there is one)."""
        known = self._family.get(id(data))
        if known is not None:
            return known
        r = FieldReader(data, where)
        r._family = self._family
        self._family[id(data)] = r
        return r

    def object(self, key: str) -> FieldReader:
        """The required object field `key`, as a reader sharing this one's record."""
        return self.child(self.get(key, dict), f"{self.where}.{key}")

    def objects(self, key: str) -> list[FieldReader]:
        """The required list field `key`, each item an object (else a PagedLabError), as
        readers sharing this one's record, named `where.key[i]`."""
        out = []
        for i, item in enumerate(self.get(key, list)):
            if not isinstance(item, dict):
                raise PagedLabError(f"{self.where}.{key}[{i}] must be an object")
            out.append(self.child(item, f"{self.where}.{key}[{i}]"))
        return out

    def accept(self, *keys: str) -> None:
        """Count `keys` as read: fields checked some other way (a parser of their own)."""
        self.asked.update(keys)

    def unread(self) -> list[str]:
        """The path of every key, in this object and in the objects read inside it, that
        nothing asked for, in the file's order. A key that is no identifier is quoted
        (\"snapshot['a b']\"), a long one cut short. An object no reader read is one
        path (its key), not one per key inside it."""
        out: list[str] = []
        for key, value in self.data.items():
            if key not in self.asked:
                out.append(field_path(self.where, key))
                continue
            # Only objects read as objects have readers: a list of token ids has none.
            inner = [value] if isinstance(value, dict) else (
                value if isinstance(value, list) and value and isinstance(value[0], dict)
                else [])
            for item in inner:
                r = self._family.get(id(item))
                if r is not None and r is not self:
                    out.extend(r.unread())
        return out

    def get(self, key: str, kind: type | tuple[type, ...], *, optional: bool = False,
            nullable: bool = False) -> Any:
        """Field `key`, of `kind`. `optional`: it may be left out or null (None for both);
        `nullable`: it must be there but may be null (a contract field such as a request's
        `parent`, which a file leaving it out would otherwise have read as null)."""
        self.asked.add(key)
        if key not in self.data:
            if optional:
                return None
            raise PagedLabError(f"{self.where}: missing field {key!r}")
        v = self.data[key]
        if v is None and (optional or nullable):
            return None
        if isinstance(v, bool | float) and kind is int:
            raise PagedLabError(f"{self.where}.{key} must be an integer, got {shown(v)}"
                                + written_as_float(v))
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(v, bool) and bool not in kinds and (int in kinds or float in kinds):
            # A bool is an int to isinstance: a number field would take false as 0.
            raise PagedLabError(f"{self.where}.{key} must be a number, got {shown(v)}")
        if not isinstance(v, kind):
            raise PagedLabError(f"{self.where}.{key} must be {_wanted(kinds)}, got {shown(v)}")
        if float in kinds and isinstance(v, int) and not isinstance(v, bool) \
                and abs(v) > sys.float_info.max:
            # JSON has no size limit; a float does, and every such field is read as one.
            raise PagedLabError(f"{self.where}.{key} must be a finite number, got {shown(v)}")
        return v

    def int_list(self, key: str, lo: int, hi: int) -> list[int]:
        v = self.get(key, list)
        for i, x in enumerate(v):
            check_int(x, f"{self.where}.{key}[{i}]", lo, hi)
        return v


def _wanted(kinds: tuple[type, ...]) -> str:
    """What a field takes, in JSON's words: "a number", "a string", "an array"..."""
    if float in kinds:
        return "a number"
    names = {int: "an integer", str: "a string", list: "an array", dict: "an object",
             bool: "true or false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


# A key longer than this is cut short in a path: a file's keys are anyone's text.
_KEY_SHOWN = 40


def field_path(where: str, key: str) -> str:
    """`where.key`, or `where['key']` where the key is no identifier (a space, a dot,
    a control character), cut to _KEY_SHOWN characters."""
    if key.isidentifier() and key.isascii() and len(key) <= _KEY_SHOWN:
        return f"{where}.{key}"
    shown = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "..."
    return f"{where}[{shown!r}]"


# How many unread fields a note names; it counts the rest.
NOTED_FIELDS = 5


def unread_note(paths: Sequence[str]) -> list[str]:
    """The note for fields a reader ignored: at most one sentence, without its final
    full stop (shown as "Note: ...." or "note: ..."), naming the first NOTED_FIELDS
    paths and counting the rest."""
    if not paths:
        return []
    if len(paths) == 1:
        return [f"{paths[0]} is not a field PagedLab reads; it was ignored"]
    named = list(paths[:NOTED_FIELDS])
    more = len(paths) - len(named)
    listed = (", ".join(named) + f" and {more:,} more" if more
              else ", ".join(named[:-1]) + f" and {named[-1]}")
    return [f"{listed} are not fields PagedLab reads; they were ignored"]


def non_negative(r: FieldReader, key: str, *, optional: bool = False) -> int:
    """An optional or required integer field that must be >= 0 (missing optional: 0)."""
    if optional:
        return optional_non_negative(r, key) or 0
    return check_int(r.get(key, int), f"{r.where}.{key}", 0, MAX_JSON_INT)


def optional_non_negative(r: FieldReader, key: str) -> int | None:
    """An optional integer field that must be >= 0; None where it is missing or null."""
    v = r.get(key, int, optional=True)
    return None if v is None else check_int(v, f"{r.where}.{key}", 0, MAX_JSON_INT)


def listed_by_id(top: FieldReader, key: str, count: int, pool: str) -> list[FieldReader]:
    """A snapshot's list of blocks under `key`: exactly `count` objects, the i-th with id
    i, each as a FieldReader named for its place. `pool` names what holds them in the
    message ("the pool has 32")."""
    raw = top.get(key, list)
    if len(raw) != count:
        raise PagedLabError(f"snapshot.{key} lists {len(raw)} blocks; the {pool} has {count}")
    out = top.objects(key)
    for i, r in enumerate(out):
        if r.get("id", int) != i:
            raise PagedLabError(f"{r.where}.id must be {i} (blocks are listed by id)")
    return out
