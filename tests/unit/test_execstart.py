"""ExecStart= round trip: what units.py writes, the ServingState fact reads back word for word."""

from __future__ import annotations

import pytest

from operations.facts.serve import parse_serving
from operations.render import execstart, units

HOSTILE = [
    "plain",
    "a b",
    "  leading and trailing  ",
    'say "hi"',
    "it's",
    "$HOME",
    "$$",
    "${X}",
    "50%",
    "%n%%",
    "back\\slash",
    "\\x41 not an escape",
    "trailing\\",
    "tab\there",
    "line\nbreak",
    "bell\x07del\x7f",
    ";",
    "a;b",
    "",
    "naïve ☃ 模型",
    '"quoted"',
    '--flag=%h/$USER \\"x\\"',
]


@pytest.mark.parametrize("word", HOSTILE)
def test_one_word_round_trips(word: str) -> None:
    line = execstart.encode(["/opt/e/bin/python", word, "--model-path", word])
    assert execstart.decode(line) == ["/opt/e/bin/python", word, "--model-path", word]


def test_every_hostile_word_in_one_line() -> None:
    assert execstart.decode(execstart.encode(HOSTILE)) == HOSTILE


def test_a_rank_unit_read_back_by_the_fact() -> None:
    """The unit text units.rank_unit renders, its ExecStart= line as the fact's `sed` prints it,
    parsed by parse_serving: the rank's argv, its engine environment and model copy."""
    env = "/opt/sg lang/envs/0.5.11-cu128-$x%"
    model = '/dev/shm/models/.Qwen--Q "3"@key\\1'
    argv = [f"{env}/bin/python", "-m", "sglang.launch_server", "--model-path", model, *HOSTILE]
    text = units.rank_unit(
        rank=0,
        gpu=0,
        port=30000,
        model_name="m",
        user="sglang",
        env={},
        argv=argv,
        device_nodes=None,
        drain_timeout_s=60,
    )
    (exec_line,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    serving = parse_serving([f"exec sglang@0.service {exec_line.removeprefix('ExecStart=')}"])
    unit = serving.ranks[0]
    assert unit.argv() == argv
    assert unit.engine_env() == env
    assert unit.model_path() == model


@pytest.mark.parametrize("line", ['"unterminated', "bad\\q", '"a"b', "x\\x4"])
def test_lines_it_cannot_split_are_refused(line: str) -> None:
    with pytest.raises(execstart.ExecStartError):
        execstart.decode(line)


def test_the_fact_reads_a_line_it_cannot_split_as_no_argv() -> None:
    serving = parse_serving(['exec sglang@0.service "/opt/e/bin/python -m'])
    assert serving.ranks[0].argv() == []
    assert serving.ranks[0].engine_env() is None


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        ("/opt/e/bin/python -m sglang.launch_server --port 30000", None),
        ("  a \t b\t\tc  ", ["a", "b", "c"]),
        ("a%%b $$c", ["a%b", "$c"]),
        ('a "b c" d', ["a", "b c", "d"]),
        ("a\\x20b", ["a b"]),
        ("", []),
    ],
)
def test_plain_words_split_on_spaces_and_tabs_only(line: str, argv: list[str] | None) -> None:
    """Words without quotes or escapes (every rank unit's line) are split on blanks alone, and
    `%%`/`$$` undone, as the character-by-character reading does."""
    assert execstart.decode(line) == (argv if argv is not None else line.split(" "))
