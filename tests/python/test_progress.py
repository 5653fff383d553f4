"""Progress on long commands (issue 21, item 6): drawn on stderr only when stderr is a
terminal and the command does not print JSON; pipes, CI logs and `--json` stay quiet.

The terminal is a real pseudo-terminal (Python's `pty`), so the binary's own `isatty` check
decides, as it does for a user at a shell.
"""

import os
import pty
import subprocess

from conftest import BINARY, ROOT

RUN = os.path.join(ROOT, "tests", "data", "gt", "h100-llama2-7b-tp1-codegen")


def stderr_on_a_terminal(*args):
    """Runs ditto with stderr on a pseudo-terminal; returns (exit code, stdout, terminal text)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [BINARY, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL
    )
    os.close(slave)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    stdout = proc.stdout.read()
    code = proc.wait(timeout=120)
    os.close(master)
    return code, stdout, seen.decode("utf-8", "replace")


def test_validate_shows_progress_on_a_terminal():
    code, stdout, terminal = stderr_on_a_terminal("validate", RUN)
    assert code == 0, terminal
    assert "replaying" in terminal, terminal
    assert b"median abs % error" in stdout


def test_validate_is_quiet_when_piped_or_json():
    piped = subprocess.run(
        [BINARY, "validate", RUN], capture_output=True, timeout=120, check=True
    )
    assert b"replaying" not in piped.stderr, piped.stderr
    code, stdout, terminal = stderr_on_a_terminal("validate", "--json", RUN)
    assert code == 0, terminal
    assert "replaying" not in terminal, terminal
    assert stdout.startswith(b"{")
