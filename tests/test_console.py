"""The one console every command prints through: text from users, files and libraries is shown
as written (never markup), never acts on the terminal (control characters), and errors are one line."""

from __future__ import annotations

import io
import json
import re

from rich.table import Table
from rich.text import Text

from trainready.cli import console as console_mod
from trainready.cli.console import line, make_console, progress, styled, visible

SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour and bold: the only escapes we send
ESC_TITLE = "p4d\x1b]0;pwned\x07\x1b[2J"  # sets the window title, clears the screen


def printed(*renderables, width: int = 80, terminal: bool = True) -> str:
    buffer = io.StringIO()
    con = make_console(file=buffer, width=width, force_terminal=terminal, color_system="standard" if terminal else None)
    for r in renderables:
        con.print(r)
    return buffer.getvalue()


def test_markup_looking_text_prints_as_written():
    text = "llama[/x] [bold]b[/] [link=https://x]y[/link] [rank0]: :smile:"
    out = printed(text, terminal=False)
    assert out == text + "\n"


def test_control_characters_never_reach_the_terminal_from_strings_tables_or_text():
    table = Table()
    table.add_column("name")
    table.add_row(ESC_TITLE)
    for renderable in (ESC_TITLE, table, Text(ESC_TITLE), styled(ESC_TITLE, "red"), line("x ", (ESC_TITLE, "bold"))):
        out = printed(renderable)
        assert "\x07" not in out and "\x1b" not in SGR.sub("", out), repr(out)  # only our colours
    assert "\\x1b]0;pwned\\x07" in printed(ESC_TITLE, terminal=False)  # shown, as \xNN, where a str is printed
    assert visible("tab\there\nnew line") == "tab\there\nnew line"


def test_our_own_styles_still_reach_a_terminal():
    assert "\x1b[31m" in printed(styled("NO", "red"))


def test_error_is_one_visible_line_and_json_keeps_the_message(monkeypatch, capsys):
    buffer = io.StringIO()
    monkeypatch.setattr(console_mod, "err", make_console(file=buffer, width=60))
    message = "find the bucket failed: Parameter validation failed:\nInvalid bucket name \"B!\": [/:] \x1b[31m"
    console_mod.error(message, as_json=True, exit_code=2)
    shown = buffer.getvalue()
    assert shown.count("\n") == 1 and shown.startswith("error: find the bucket failed: Parameter validation failed: ")
    assert "[/:] \\x1b[31m" in shown  # long: not wrapped (soft wrap), brackets and escapes visible
    assert json.loads(capsys.readouterr().out) == {"schema_version": 1,
                                                   "error": {"message": message, "exit_code": 2}}


def test_progress_is_silent_off_a_terminal(monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(console_mod, "err", make_console(file=buffer, force_terminal=False))
    with progress("pulling", total=10, unit="bytes") as sink:
        sink.advance(5)
        sink.set_total(20)
    assert buffer.getvalue() == ""
    buffer = io.StringIO()
    monkeypatch.setattr(console_mod, "err", make_console(file=buffer, force_terminal=True, width=80))
    with progress("pulling", total=10, as_json=True) as sink:  # --json: never, even on a terminal
        sink.advance(5)
    assert buffer.getvalue() == ""
    with progress("pulling", total=10) as sink:
        sink.advance(10)
    assert "pulling" in buffer.getvalue()


def test_bidi_overrides_and_line_separators_never_reach_the_terminal():
    """issue 26: U+202E from an endpoint reached the terminal in `account`, reordering what followed it. Bidi marks,
    embeddings, overrides and isolates and the line/paragraph separators are escaped like control characters,
    in plain strings, in Text built elsewhere and in the account report's lines; joiners (emoji) stay."""
    from trainready.cli.render_account import _Lines

    hostile = "quota exe\u202etxt.\u2066x\u2069\u2028y \U0001F468\u200D\U0001F469"
    # strings and styled pieces show the code point; a Text built elsewhere gets the replacement character
    for renderable, shown in ((hostile, "\\u202e"), (styled(hostile, "bold"), "\\u202e"), (Text(hostile), "\ufffd")):
        out = printed(renderable, terminal=False)
        assert not any(c in out for c in "\u202e\u2066\u2069\u2028"), repr(out)
        assert shown in out and "\u200d" in out
    rows = _Lines(indent=0)
    rows.add("unknown", f"offerings: {hostile}")
    buffer = io.StringIO()
    rows.print(make_console(file=buffer, width=100))
    assert "\u202e" not in buffer.getvalue() and "\\u202e" in buffer.getvalue()


def test_every_error_message_is_redacted_in_text_and_json(capsys):
    """issue 26: `s3://user:SECRET@bucket` was quoted raw by the bucket-name errors of run, account, ckpt and data,
    in text and --json. Every error goes through one printer (console.error), which redacts."""
    from trainready.cli.console import error

    for as_json in (False, True):
        error("s3://AKIA:wJalrSECRET@Bad_Bucket/x: invalid bucket name; endpoint admin:hunter2@10.0.0.1:9000",
              as_json=as_json, exit_code=2)
        captured = capsys.readouterr()
        both = captured.out + captured.err
        assert "wJalrSECRET" not in both and "hunter2" not in both and "s3://***@Bad_Bucket/x" in both
        if as_json:
            assert json.loads(captured.out)["error"]["message"].startswith("s3://***@Bad_Bucket/x")


def test_credentials_in_a_bucket_url_never_leave_any_command(tmp_path, monkeypatch):
    """issue 26, end to end: `s3://user:SECRET@bucket` given to run, ckpt, data and plan --live --data is quoted
    masked by each command's own bucket-name error, in text and --json; nothing is launched or asked."""
    from cloud_stubs import invoke

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    url = "s3://AKIA:wJalrSECRET@Bad_Bucket/x"
    commands = [("run", "--run-dir", str(tmp_path / "r"), "--archive", url, "--", "python", "train.py"),
                ("ckpt", "ls", url), ("data", "pack", str(tmp_path), "--out", url),
                ("plan", "--model", "llama-2-7b", "--method", "lora", "--tokens", "1e8", "--live", "--data", url)]
    for command in commands:
        for extra in ((), ("--json",)):
            at = 2 if command[0] in ("ckpt", "data") else 1  # after the subcommand, before run's `--`
            code, out, err = invoke(*command[:at], *extra, *command[at:])
            both = out + err
            assert code == 2 and "wJalrSECRET" not in both and "AKIA" not in both, (command, extra, both[-400:])
            assert "***@Bad_Bucket" in both and "Traceback" not in both, (command, both[-400:])
