"""Problem files of the public formats: bad rows skipped with their file and row, files, formats
and options that fail clearly, parquet, the save / load round trip, ``fastcrit data convert``.
The rows are test_formats.py's."""

import argparse
import gzip
import json

import pytest
from test_formats import APPS_CODEWARS, APPS_STDIO, CC_ROW, LCB_FUNCTIONAL, LCB_STDIN, write_jsonl

from fastcrit.data import cli as data_cli
from fastcrit.data.datasets import DatasetError
from fastcrit.data.problem_files import ProblemSet, load_problems, save_problems
from fastcrit.data.problems import Problem


def test_bad_rows_are_skipped_with_file_and_row(tmp_path):
    rows = [
        APPS_STDIO,
        "{not json",
        {**APPS_CODEWARS, "input_output": '{"fn_name": "digits_sum", "inputs": [[1]'},
        {k: v for k, v in APPS_CODEWARS.items() if k != "question"},
        {**APPS_CODEWARS, "problem_id": 7, "input_output": json.dumps({"fn_name": "f", "inputs": [1], "outputs": [1]})},
        {**APPS_STDIO, "problem_id": 8, "input_output": json.dumps({"inputs": ["1"], "outputs": [["1", 2]]})},
        {**APPS_STDIO, "problem_id": 9, "solutions": 42},
        {**APPS_STDIO, "problem_id": 10, "input_output": json.dumps({"inputs": ["1", "2"], "outputs": ["1"]})},
        "",
        {**APPS_STDIO, "problem_id": 11, "input_output": ""},
        [1, 2],
        APPS_STDIO,  # same id again
        APPS_CODEWARS,
    ]
    path = write_jsonl(tmp_path / "apps.jsonl", rows)
    ps = load_problems(path)
    assert [p.id for p in ps.problems] == ["apps/4001", "apps/2401"] and len(ps.skipped) == 10
    reasons = dict(s[len(path) + 1 :].split(": ", 1) for s in ps.skipped)
    assert reasons["2"].startswith("not valid JSON")
    assert reasons["3"].startswith("'input_output' is not valid JSON")
    assert reasons["4"] == "missing field 'question'"
    assert reasons["5"] == "'input_output'.inputs[0] must be a list of arguments for fn_name 'f', got int"
    assert reasons["6"] == "'input_output'.outputs[0] must be a string or a list of strings, got list"
    assert reasons["7"] == "'solutions' must be a list of strings, got int"
    assert reasons["8"] == "'input_output' has 2 inputs but 1 outputs"
    assert reasons["10"] == "'input_output' is empty (no tests)"
    assert reasons["11"] == "expected a JSON object, got list"
    assert reasons["12"] == "duplicate id 'apps/4001' (first at row 1)"
    # limit counts problems; max_tests trims each problem
    assert [p.id for p in load_problems(path, limit=1).problems] == ["apps/4001"]
    assert {len(p.tests) for p in load_problems(path, max_tests=2).problems} == {2}


def test_files_formats_and_options_fail_clearly(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_problems(str(tmp_path / "missing.jsonl"))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "no tests", "input_output": "{}"}])
    with pytest.raises(DatasetError, match=r"bad.jsonl: no usable problems \(first problem: .*bad.jsonl:1: "):
        load_problems(bad)
    other = write_jsonl(tmp_path / "other.jsonl", [{"prompt": "x", "answer": "y"}])
    with pytest.raises(DatasetError, match="match no known format"):
        load_problems(other)
    with pytest.raises(DatasetError, match="takes no option 'test_sets'"):
        load_problems(write_jsonl(tmp_path / "a.jsonl", [APPS_STDIO]), test_sets=("public",))
    with pytest.raises(DatasetError, match="unknown format"):
        load_problems(bad, fmt="leetcode")
    csv = tmp_path / "p.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DatasetError, match="expected a .jsonl"):
        load_problems(str(csv))
    # an explicit format overrides detection (an APPS row read as TACO keeps its problem_id)
    ps = load_problems(write_jsonl(tmp_path / "t.jsonl", [APPS_STDIO]), fmt="taco")
    assert ps.format == "taco" and ps.problems[0].id == "taco/4001"
    gz = tmp_path / "HumanEval-like.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(
            json.dumps(
                {
                    "task_id": "X/0",
                    "prompt": "def f():\n",
                    "canonical_solution": "    return 1\n",
                    "test": "def check(c):\n    assert c() == 1\n",
                    "entry_point": "f",
                }
            )
            + "\n"
        )
    assert load_problems(str(gz)).problems[0].tests[0].endswith("check(f)\n")


def test_parquet_needs_pyarrow_or_reads_rows(tmp_path):
    path = tmp_path / "apps.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(DatasetError, match=r"pip install pyarrow"):
            load_problems(str(path))
        return
    pq.write_table(pa.Table.from_pylist([APPS_STDIO, APPS_CODEWARS]), str(path))
    assert [p.id for p in load_problems(str(path)).problems] == ["apps/4001", "apps/2401"]


def test_save_and_load_round_trip(tmp_path):
    ps = load_problems(write_jsonl(tmp_path / "lcb.jsonl", [LCB_FUNCTIONAL, LCB_STDIN]))
    out = tmp_path / "sub" / "problems.jsonl"
    assert save_problems(ps, str(out)) == 2
    back = load_problems(str(out))
    assert back.format == "fastcrit" and [p.to_dict() for p in back.problems] == [p.to_dict() for p in ps.problems]
    assert isinstance(back, ProblemSet) and isinstance(back.problems[0], Problem)
    with pytest.raises(TypeError):
        save_problems([{"id": "x"}], str(out))
    assert len(load_problems(str(out), "fastcrit")) == 2  # the failed save left the old file whole


def test_cli_convert(tmp_path, capsys):
    src = write_jsonl(tmp_path / "cc.jsonl", [CC_ROW, {"name": "broken"}, "{oops"])
    out = tmp_path / "out.jsonl"
    parser = argparse.ArgumentParser(prog="fastcrit")
    data_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "convert", src, str(out), "--tests", "public,private", "--limit", "5"])
    assert args.func(args) == 0
    printed = capsys.readouterr()
    assert "converted 1 problem (codecontests)" in printed.out and "skipped 2" in printed.out
    assert f"{src}:2: missing field 'description'" in printed.out and f"{src}:3: not valid JSON" in printed.out
    (p,) = load_problems(str(out), "fastcrit").problems
    assert len(p.tests) == 3  # public + private only
    assert data_cli.main(["data", "convert", str(tmp_path / "nope.jsonl"), str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert data_cli.main(["data", "convert", src, str(out), "--format", "apps"]) == 2
    assert "no usable problems" in capsys.readouterr().err


def test_problem_files_take_utf8_with_a_bom_json_arrays_and_strict(tmp_path, capsys):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(("\n".join(json.dumps(r) for r in (APPS_STDIO, APPS_CODEWARS)) + "\n").encode("utf-8-sig"))
    assert [p.id for p in load_problems(str(bom)).problems] == ["apps/4001", "apps/2401"]
    arr = tmp_path / "apps.json"
    arr.write_text("[\n" + ",\n".join(json.dumps(r) for r in (APPS_STDIO, {"question": "x"}, APPS_CODEWARS)) + "\n]")
    ps = load_problems(str(arr))
    assert [p.id for p in ps.problems] == ["apps/4001", "apps/2401"]
    assert ps.skipped == [f"{arr}:3: missing field 'input_output'"]
    with pytest.raises(DatasetError, match=rf"^{arr}: 1 row skipped and data.strict is true: {arr}:3: "):
        load_problems(str(arr), strict=True)
    # the data CLI: a bad byte is one line naming file and line; a row of no format names --format
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(APPS_STDIO).encode() + b"\n" + b'{"question": "\xff"}\n')
    assert data_cli.main(["data", "convert", str(bad), str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"fastcrit data convert: {bad}:2: not UTF-8 text (byte 0xff at byte 15 of the line); "
        "save the file as UTF-8\n"
    )
    other = write_jsonl(tmp_path / "other.jsonl", [{"prompt": "x", "answer": "y"}, APPS_STDIO])
    assert data_cli.main(["data", "convert", other, str(tmp_path / "o.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "match no known format (name one with --format, or data.format in a config: fastcrit, " in out
    assert "fmt=" not in out


def test_convert_shows_a_progress_bar_on_a_terminal_only(tmp_path, on_a_terminal):
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "apps.jsonl", [APPS_STDIO, APPS_CODEWARS])
    cmd = [sys.executable, "-m", "fastcrit.data.cli", "data", "convert", src, str(tmp_path / "o.jsonl")]
    rc, shown = on_a_terminal(cmd)
    assert rc == 0 and "reading apps.jsonl: 2row [" in shown, shown
    rc, shown = on_a_terminal(cmd + ["--no-progress"])
    assert rc == 0 and "reading" not in shown
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == ""
