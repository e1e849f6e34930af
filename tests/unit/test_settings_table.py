"""Every setting is read in one place and documented in one table: each `Settings` field is a
`VL_<NAME>` row of the Settings table in docs/operations.md (and each row a field), and no module but
vlservice/config.py reads a `VL_*` variable from the environment (setting one for a child process
is fine)."""

from __future__ import annotations

import re
from dataclasses import fields

from conftest import ROOT

from vlservice.config import Settings

# os.environ.get("VL_..."), os.getenv("VL_..."), environ.pop("VL_..."), os.environ["VL_..."] not
# followed by an assignment, "VL_..." in os.environ
READS = re.compile(
    r"""(?:environ\.get|getenv|environ\.pop)\(\s*[rbuf]?["']VL_\w*"""
    r"""|environ\[\s*[rbuf]?["']VL_\w*["']\s*\](?!\s*=[^=])"""
    r"""|["']VL_\w*["']\s+(?:not\s+)?in\s+os\.environ"""
)


def documented_settings() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = re.search(r"^## Settings\n(.*?)^## ", text, re.S | re.M)
    assert section, "docs/operations.md has no '## Settings' section"
    return re.findall(r"^\| `(VL_\w+)` \|", section.group(1), re.M)


def source_files() -> list:
    files = sorted((ROOT / "vlservice").rglob("*.py"))
    return files + [ROOT / name for name in ("app.py", "wsgi.py", "gunicorn.conf.py")]


def test_every_setting_is_a_row_of_the_settings_table_and_every_row_a_setting():
    rows = documented_settings()
    names = {"VL_" + f.name.upper() for f in fields(Settings)}
    assert sorted(names - set(rows)) == [], "settings missing from the Settings table in docs/operations.md"
    assert sorted(set(rows) - names) == [], "Settings table rows that are no setting"
    assert len(rows) == len(set(rows)), "a variable listed twice"


def test_only_config_reads_vl_variables():
    readers = []
    for path in source_files():
        if path == ROOT / "vlservice" / "config.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if READS.search(line):
                readers.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert readers == []


def test_the_pattern_catches_reads_and_lets_writes_pass():
    reads = ['os.environ.get("VL_BIND", "x")', "os.getenv('VL_WORKERS')", 'int(os.environ["VL_X"])',
             'if "VL_X" in os.environ:', 'os.environ.pop("VL_X", None)']
    writes = ['env["VL_BIND"] = bind', 'os.environ["VL_X"] = "1"', '{**os.environ, "VL_BIND": b}',
              'os.environ.setdefault("VL_DEFER_START", "1")']
    assert [bool(READS.search(s)) for s in reads] == [True] * len(reads)
    assert [bool(READS.search(s)) for s in writes] == [False] * len(writes)
