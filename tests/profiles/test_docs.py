"""profiles/docs.py: the docs the output cites are the installed ones (hotloop.docs, package data of docs/*.md),
printed relative to a checkout's working folder and absolute elsewhere."""

from pathlib import Path

import pytest

from hotloop.profiles.docs import doc_path, doc_ref

ROOT = Path(__file__).resolve().parents[2]


def test_each_doc_of_the_checkout_is_found_where_hotloop_is_installed():
    for doc in sorted((ROOT / "docs").glob("*.md")):
        path = doc_path(doc.name)
        assert path.is_file() and path.read_text() == doc.read_text()


def test_the_reference_is_relative_inside_the_working_folder_and_absolute_outside(tmp_path):
    path = doc_path("criteria.md").resolve()
    assert doc_ref("criteria.md", cwd=path.parents[1]) == "docs/criteria.md"
    assert doc_ref("nsight.md", cwd=tmp_path) == str(path.with_name("nsight.md"))


@pytest.mark.parametrize(
    "name,match",
    [
        ("nosuch.md", "'nosuch.md' is not installed"),
        ("../README.md", "must be a file name of docs/"),
        ("", "file name"),
    ],
)
def test_an_unknown_or_path_like_name_is_refused_naming_it(name, match):
    with pytest.raises(ValueError, match=match):
        doc_path(name)
