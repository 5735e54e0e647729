"""ExecStart= words: the one encoder (units.py writes unit files with it) and its inverse (the
ServingState fact reads a unit's ExecStart= back with it).

systemd.service(5) "Command lines" and systemd.syntax(7) "Quoting": a command line is words
separated by spaces; a word in double quotes may hold spaces, and C escapes (`\\\\`, `\\"`,
`\\xNN`, `\\n`, ...) are decoded in it; `%` starts a specifier (`%%` is one `%`) and `$` an
environment variable (`$$` is one `$`); a lone `;` separates two commands (`\\;` is a word).

`encode` escapes the specifiers and variables first, then quotes (C escapes) every word that
holds anything but plainly safe characters; `decode` undoes the quoting, then the specifiers,
so `decode(encode(argv)) == argv` for every argv (tests/unit/test_execstart.py).
"""

from __future__ import annotations

import re

_SAFE_WORD = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# systemd's C unescaping (cunescape): the single-character escapes it knows.
_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "s": " ",
    "\\": "\\",
    '"': '"',
    "'": "'",
    ";": ";",
}


class ExecStartError(ValueError):
    """An ExecStart= line this decoder cannot split (an unterminated quote, a bad escape)."""


def c_escape(text: str) -> str:
    """Backslashes, double quotes and control characters as C escapes (inside double quotes)."""
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def encode_word(arg: str) -> str:
    """One ExecStart= word, passed to the program unchanged."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and _SAFE_WORD.fullmatch(escaped):
        return escaped
    if escaped == ";":
        return "\\;"  # a lone ';' would separate two commands
    return f'"{c_escape(escaped)}"'


def encode(argv: list[str]) -> str:
    """ExecStart='s value for this argv."""
    return " ".join(encode_word(a) for a in argv)


_BLANKS = re.compile("[ \t]+")


def _unescape(text: str, i: int) -> tuple[str, int]:
    """The character of the escape at text[i] (just after its backslash), and the next index."""
    if i >= len(text):
        raise ExecStartError("a backslash ends the line")
    c = text[i]
    if c in _SIMPLE:
        return _SIMPLE[c], i + 1
    if c == "x":
        digits = text[i + 1 : i + 3]
        if len(digits) == 2 and all(d in "0123456789abcdefABCDEF" for d in digits):
            return chr(int(digits, 16)), i + 3
        raise ExecStartError(f"bad \\x escape at {i}")
    if c in "01234567":
        digits = text[i : i + 3]
        if len(digits) == 3 and all(d in "01234567" for d in digits):
            return chr(int(digits, 8)), i + 3
        raise ExecStartError(f"bad octal escape at {i}")
    raise ExecStartError(f"unknown escape \\{c} at {i}")


def _split(line: str) -> list[str]:
    if '"' not in line and "\\" not in line:
        # Nothing quoted or escaped (most lines): words between spaces and tabs, as below.
        return [word for word in _BLANKS.split(line) if word]
    words: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quoted = False
        if line[i] == '"':
            quoted = True
            i += 1
        while True:
            if i >= n:
                if quoted:
                    raise ExecStartError("unterminated quote")
                break
            c = line[i]
            if quoted and c == '"':
                i += 1
                if i < n and line[i] not in " \t":
                    raise ExecStartError(f"no space after the closing quote at {i}")
                break
            if not quoted and c in " \t":
                break
            if c == "\\":
                char, i = _unescape(line, i + 1)
                word.append(char)
                continue
            word.append(c)
            i += 1
        words.append("".join(word))


def decode(line: str) -> list[str]:
    """The argv an ExecStart= value (as `encode` writes it) runs: quotes and C escapes undone,
    then `%%` -> `%` and `$$` -> `$`. Raises ExecStartError on a line it cannot split."""
    return [_unspecify(w) for w in _split(line)]


def _unspecify(word: str) -> str:
    if "%" not in word and "$" not in word:
        return word
    out: list[str] = []
    i = 0
    while i < len(word):
        pair = word[i : i + 2]
        if pair in ("%%", "$$"):
            out.append(pair[0])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)
