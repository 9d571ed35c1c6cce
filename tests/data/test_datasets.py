import json

import pytest

from fastcrit.data.datasets import DatasetError, load_dataset
from fastcrit.data.tasks import make_reverse


def test_shipped_reverse_task_matches_its_generator():
    train = load_dataset("reverse")
    test = load_dataset("reverse:test")
    made = make_reverse()
    assert [e.prompt for e in train.examples] == [r["prompt"] for r in made["train"]]
    assert len(test) == 200 and not train.skipped
    assert not {e.prompt for e in train.examples} & {e.prompt for e in test.examples}
    ex = test.examples[0]
    letters = ex.prompt.split(": ")[1].split()
    assert ex.answer.split() == letters[::-1]


def test_bad_rows_are_counted_with_line_numbers(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [
        json.dumps({"prompt": "a", "answer": "b"}),
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"answer": "x"}),
        "",
        json.dumps({"prompt": "c", "answer": 3, "extra": 1}),
    ]
    p.write_text("\n".join(rows) + "\n")
    d = load_dataset(str(p))
    assert [e.prompt for e in d.examples] == ["a", "c"]
    assert d.examples[1].answer == "3" and d.examples[1].meta == {"extra": 1}
    assert len(d.skipped) == 3
    assert d.skipped[0].endswith(":2: not valid JSON (Expecting property name enclosed in double quotes)")
    assert ":3: expected a JSON object" in d.skipped[1] and ":4: missing" in d.skipped[2]


def test_nothing_usable_or_unknown_source_is_a_clear_error(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("{}\n")
    with pytest.raises(DatasetError, match="no usable examples"):
        load_dataset(str(p))
    with pytest.raises(DatasetError, match="not a shipped task"):
        load_dataset("no-such-task")
    with pytest.raises(DatasetError, match="has no split"):
        load_dataset("reverse:dev")


# --- files: encodings, a BOM, .json arrays, strict mode ---------------------------------------------

ROWS = [{"prompt": "a", "answer": "b"}, {"prompt": "c", "answer": "d"}, {"prompt": "e", "answer": "f"}]


def test_a_byte_that_is_not_utf8_names_the_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in ROWS[:2]) + b'{"prompt": "caf\xe9", "answer": "x"}\n'
    )
    with pytest.raises(DatasetError) as e:
        load_dataset(str(p))
    assert str(e.value) == (f"{p}:3: not UTF-8 text (byte 0xe9 at byte 16 of the line); save the file as UTF-8")
    j = tmp_path / "d.json"
    j.write_bytes(b'[\n  {"prompt": "a", "answer": "b"},\n  {"prompt": "\xff"}\n]\n')
    with pytest.raises(DatasetError, match=rf"^{j}:3: not UTF-8 text \(byte 0xff at byte 15 of the line\)"):
        load_dataset(str(j))


def test_the_cli_reports_a_data_error_in_one_line(tmp_path, capsys):
    from fastcrit.cli import main

    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"prompt": "\xe9", "answer": "x"}\n')
    assert (
        main(
            [
                "sft",
                "configs/cpu/sft.yaml",
                "--set",
                f"sft.data={p}",
                "--set",
                "sft.steps=1",
                "--set",
                f"trainer.output_dir={tmp_path / 'out'}",
                "--set",  # configs/cpu/sft.yaml's own runs/cpu-sft may hold a finished model (reused)
                f"sft.output_dir={tmp_path / 'sft'}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1] == f"fastcrit: data error: {p}:1: not UTF-8 text (byte 0xe9 at byte 13 of the line); "
        "save the file as UTF-8"
    )
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_utf8_bom_keeps_the_first_row(tmp_path, suffix):
    p = tmp_path / f"d{suffix}"
    text = "\n".join(map(json.dumps, ROWS)) + "\n" if suffix == ".jsonl" else json.dumps(ROWS, indent=1)
    p.write_bytes(text.encode("utf-8-sig"))
    d = load_dataset(str(p))
    assert [e.prompt for e in d.examples] == ["a", "c", "e"] and not d.skipped


def test_a_json_array_reads_like_jsonl_with_the_line_of_each_row(tmp_path):
    import gzip

    p = tmp_path / "d.json"
    p.write_text(
        '[\n  {"prompt": "a", "answer": "b"},\n  {"answer": "no prompt"},\n  [1],\n'
        '  {"prompt": "c",\n   "answer": "d"}, {"prompt": "e", "answer": "f"}\n]\n'
    )
    d = load_dataset(str(p))
    assert [(e.prompt, e.answer) for e in d.examples] == [("a", "b"), ("c", "d"), ("e", "f")]
    assert d.skipped == [f"{p}:3: missing or non-string 'prompt'", f"{p}:4: expected a JSON object, got list"]
    gz = tmp_path / "d.json.gz"
    with gzip.open(gz, "wt") as f:
        json.dump(ROWS, f)
    assert len(load_dataset(str(gz))) == 3
    bad = tmp_path / "bad.json"
    bad.write_text('[\n{"prompt": "a"},\n{"prompt" "b"}\n]')
    with pytest.raises(DatasetError, match=rf"^{bad}:3: not valid JSON \(Expecting ':' delimiter at column 11\)"):
        load_dataset(str(bad))
    one = tmp_path / "one.json"
    one.write_text(json.dumps(ROWS[0]))
    with pytest.raises(DatasetError, match="expected a JSON array of objects"):
        load_dataset(str(one))
    notgz = tmp_path / "x.jsonl.gz"
    notgz.write_text("{}\n")
    with pytest.raises(DatasetError, match="not a readable gzip file"):
        load_dataset(str(notgz))


def test_strict_turns_skipped_rows_into_an_error_naming_the_first_few(tmp_path):
    from fastcrit.data.datasets import load_preferences

    p = tmp_path / "d.jsonl"
    p.write_text("\n".join([json.dumps(ROWS[0]), "{bad", "[]", "{}", json.dumps({"answer": 1}), "7"]) + "\n")
    assert len(load_dataset(str(p)).skipped) == 5  # counted, not fatal, by default
    with pytest.raises(DatasetError) as e:
        load_dataset(str(p), strict=True)
    msg = str(e.value)
    assert msg.startswith(f"{p}: 5 rows skipped and data.strict is true: {p}:2: not valid JSON")
    assert f"{p}:3: expected a JSON object" in msg and f"{p}:4: missing" in msg
    assert f"{p}:5:" not in msg and msg.endswith("; and 2 more")
    assert len(load_dataset("reverse", strict=True)) > 0
    prefs = tmp_path / "p.jsonl"
    prefs.write_text(
        json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"})
        + "\n"
        + json.dumps({"prompt": "q", "chosen": "a", "rejected": "a"})
        + "\n"
    )
    assert len(load_preferences(str(prefs))[1]) == 1
    with pytest.raises(DatasetError, match=r"1 row skipped and data.strict is true: .*:2: 'chosen' and 'rejected'"):
        load_preferences(str(prefs), strict=True)


def test_data_strict_is_a_typed_config_key():
    from fastcrit.config import ConfigError, load_config

    assert load_config(None).data.strict is False
    assert load_config(None, ["data.strict=true"]).data.strict is True
    with pytest.raises(ConfigError, match="data.strict"):
        load_config(None, ["data.strict=maybe"])


def test_data_strict_reaches_the_recipes(tmp_path, capsys):
    from fastcrit.cli import main
    from fastcrit.recipes.ctrl.shared import load_problem_set

    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    assert (
        main(
            [
                "sft",
                "configs/cpu/sft.yaml",
                "--set",
                f"sft.data={p}",
                "--set",
                "sft.steps=1",
                "--set",
                "data.strict=true",
                "--set",
                f"trainer.output_dir={tmp_path / 'out'}",
                "--set",  # configs/cpu/sft.yaml's own runs/cpu-sft may hold a finished model (reused)
                f"sft.output_dir={tmp_path / 'sft'}",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fastcrit: data error: {p}: 1 row skipped and data.strict is true: {p}:2: not valid JSON "
        "(Expecting property name enclosed in double quotes)"
    )
    problems = tmp_path / "p.json"
    problems.write_text(
        json.dumps(
            [
                {"id": "x", "question": "p", "test_kind": "assert", "tests": ["assert f() == 1"], "entry_point": "f"},
                {"id": "y"},
            ]
        )
    )
    assert len(load_problem_set(str(problems), "auto", log=lambda m: None)) == 1
    with pytest.raises(DatasetError, match=rf"{problems}: 1 row skipped and data.strict is true: {problems}:1: "):
        load_problem_set(str(problems), "auto", strict=True)
