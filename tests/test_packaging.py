"""Packaging metadata: the licence text ships, PyPI shows classifiers and project links, and every
upper version pin says why it is there."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_license_file_is_the_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License\n                           Version 2.0, January 2004" in text
    for section in ("1. Definitions.", "4. Redistribution.", "9. Accepting Warranty or Additional Liability.",
                    "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."):
        assert section in text
    assert len(text) > 11000


def test_classifiers_and_urls():
    classifiers = PROJECT["classifiers"]
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert any(c.startswith("Topic :: ") for c in classifiers)
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert PROJECT["urls"] and all(u.startswith("https://") for u in PROJECT["urls"].values())


def test_every_upper_pin_has_a_reason():
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    pinned = [i for i, line in enumerate(lines) if re.search(r'"[A-Za-z0-9_.\[\]-]+[^"]*<[^"]*"', line)]
    assert pinned, "the check found no dependency line at all"
    for i in pinned:
        # a comment on the line itself, or a comment block right above it
        assert "#" in lines[i].split('"')[-1] or lines[i - 1].strip().startswith("#"), lines[i]
    deps = PROJECT["dependencies"] + [d for extra in PROJECT["optional-dependencies"].values() for d in extra]
    assert not [d for d in deps if d.startswith("pandas") and "<" in d]


def test_test_extra_has_the_readers_the_export_tests_use():
    assert {re.split(r"[<>=\[]", d)[0] for d in PROJECT["optional-dependencies"]["test"]} >= {"duckdb", "pandas"}
