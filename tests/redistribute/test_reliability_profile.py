"""Regressions: hostile hardware-profile text is a PlanError (or exit 2 on the command line)."""

import pytest

from meshplan.errors import PlanError
from meshplan.redistribute import HardwareProfile
from meshplan.redistribute._cli import main


@pytest.mark.parametrize(
    "text",
    ["[" * 100000, "{" * 100000, b"[" * 100000, '{"a":' * 50000, b"\xff\xfe{}"],
    ids=["lists", "objects", "bytes", "keys", "not-utf8"],
)
def test_deeply_nested_or_undecodable_profile_text_is_a_plan_error(text):
    with pytest.raises(PlanError, match="hardware profile"):
        HardwareProfile.from_json(text)


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00junk", b"\x80" * 10, b"[" * 100000], ids=["bom", "high", "nested"]
)
def test_a_profile_file_that_is_not_utf8_json_exits_2_with_one_line(capsys, tmp_path, content):
    path = tmp_path / "profile.json"
    path.write_bytes(content)
    argv = ["plan", "--mesh", "2", "--src", "S(0)", "--dst", "R", "--shape", "4"]
    assert main(argv + ["--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshplan: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_directory_as_profile_exits_2(capsys, tmp_path):
    argv = ["plan", "--mesh", "2", "--src", "S(0)", "--dst", "R", "--shape", "4"]
    assert main(argv + ["--profile", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("meshplan: error: ")
