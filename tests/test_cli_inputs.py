"""Careless and hostile command-line input: every one stops with one line naming what was wrong
(exit 2), before any rank starts or any weight loads, never a traceback, a hang or a silent other
value. The CLI runs in process; ``launch`` is replaced so that a check that lets a run through
fails the test at once instead of training."""

import json

import pytest

import fastcrit.cli as cli
from fastcrit.cli import main
from fastcrit.config import ConfigError, load_config

CONFIG = "configs/cpu/grpo.yaml"


@pytest.fixture
def no_launch(monkeypatch):
    def launched(*a, **k):
        raise AssertionError("the run was launched: a check let it through")

    monkeypatch.setattr(cli, "_run", launched)


def _error(capsys, argv) -> str:
    """The one stderr line of ``fastcrit argv``, which must exit 2."""
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def _write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return str(p)


# -- the config file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"rollout:\n  n: 4\n\xff bad\n", r"byte 16 \(0xff\) is not utf-8"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", r"is not utf-8|character .*0x"),
        (b"rollout:\n  n: 4\x00\n", r"character 15 \(0x00\)"),
        ("rollout:\n\tn: 4\n", r"line 2, column 1: .*'\\t'"),
        ("rollout:\n  n: 4\n---\nrollout:\n  n: 5\n", r"line 3, column 1: .*single document"),
        ("rollout: !!python/object/apply:os.system [echo]\n", r"line 1, column 10: .*constructor"),
    ],
)
def test_an_unreadable_config_is_one_line(tmp_path, capsys, content, expected):
    path = _write(tmp_path, content)
    err = _error(capsys, ["plan", path])
    assert err.startswith(f"fastcrit: config error: {path}: not valid YAML: ")
    assert __import__("re").search(expected, err), err


def test_a_utf16_config_with_its_bom_loads(tmp_path):
    assert load_config(_write(tmp_path, "rollout:\n  n: 4\n".encode("utf-16"))).rollout.n == 4


def test_a_directory_is_not_a_config(tmp_path, capsys):
    assert "is a directory, not a config file" in _error(capsys, ["plan", str(tmp_path)])


@pytest.mark.parametrize(
    "text, line",
    [("rollout:\n  n: 4\n  n: 5\n", 3), ("rollout:\n  n: 4\noptim:\n  lr: 1.0\nrollout:\n  top_k: 2\n", 5)],
)
def test_a_duplicate_key_is_refused_not_silently_the_last(tmp_path, text, line):
    with pytest.raises(ConfigError, match=rf"line {line}, column \d+: duplicate key 'n|rollout'"):
        load_config(_write(tmp_path, text))


def test_aliases_and_merge_keys_still_work(tmp_path):
    c = load_config(
        _write(tmp_path, "sft: &s\n  lr: 0.01\n  warmup_steps: 3\nrm: *s\nrollout:\n  <<: {n: 4}\n  top_k: 2\n")
    )
    assert (c.rm.lr, c.rm.warmup_steps, c.rollout.n, c.rollout.top_k) == (0.01, 3, 4, 2)


def _bomb(under: str) -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    prev = "a"
    for c in "bcdefghi":
        lines.append(f"{c}: &{c} [{', '.join(['*' + prev] * 9)}]")
        prev = c
    return "rollout:\n  engine_args:\n" + "".join(f"    {x}\n" for x in lines) + under


@pytest.mark.parametrize("under", ["", "  n: *i\n"])  # kept (engine_args takes anything), or in an error
def test_an_alias_bomb_is_refused_at_once(tmp_path, under):
    # 9**9 strings once expanded: accepted before, dumping config.yaml (or repr in an error) hung
    with pytest.raises(ConfigError, match="more than 100000 values once its aliases are expanded"):
        load_config(_write(tmp_path, _bomb(under)))


def test_deep_nesting_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="nested deeper than"):  # a RecursionError before
        load_config(_write(tmp_path, "rollout:\n  engine_args:\n    x: " + "[" * 3000 + "]" * 3000 + "\n"))


@pytest.mark.parametrize("raw", ["1:20", "017", "-1:00"])
def test_yaml11_base60_and_octal_are_not_numbers(raw):
    # YAML 1.1 read 1:20 as 80 and 017 as 15: a silent other value
    with pytest.raises(ConfigError, match=rf"rollout.n: expected int, got str '{raw}'"):
        load_config(None, [f"rollout.n={raw}"])
    assert load_config(None, [f"trainer.output_dir={raw}"]).trainer.output_dir == raw


def test_explicit_number_forms_still_read():
    c = load_config(None, ["rollout.n=0x10", "trainer.total_steps=1_000", "optim.lr=1e-6", "optim.eps=.5"])
    assert (c.rollout.n, c.trainer.total_steps, c.optim.lr, c.optim.eps) == (16, 1000, 1e-6, 0.5)


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["rollout.nn=3"], "rollout.nn: unknown key; did you mean rollout.n?"),
        (["rolout.n=3"], "rolout: unknown key; did you mean rollout?"),
        (["ROLLOUT.n=3"], "ROLLOUT: unknown key; did you mean rollout?"),
        (["trainer.lr=3"], "trainer.lr: unknown key; it is a key of optim.lr and sft.lr and rm.lr"),
        (["rollout={n:4}"], "rollout.n:4: unknown key (YAML needs a space after the colon: write 'n: 4')"),
        (["trainer.zzzz=1"], "trainer.zzzz: unknown key (known here: "),
    ],
)
def test_an_unknown_key_names_what_was_meant(sets, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, sets)
    assert expected in str(e.value)


def test_a_top_level_key_of_a_section_names_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"n: unknown key; it is a key of rollout.n and proxy.rollout.n"):
        load_config(_write(tmp_path, "n: 4\n"))


def test_a_set_value_that_is_not_yaml_is_one_line(capsys):
    err = _error(capsys, ["plan", CONFIG, "--set", "rollout.n=["])
    assert "--set 'rollout.n=[': not valid YAML: line 1, column 2:" in err


def test_a_nul_in_a_string_is_refused(tmp_path):
    # os.makedirs raised "embedded null byte" in the rank before
    with pytest.raises(ConfigError, match="trainer.output_dir: contains a NUL character"):
        load_config(_write(tmp_path, 'trainer:\n  output_dir: "a\\0b"\n'))


def test_a_boolean_for_a_string_says_to_quote_it():
    with pytest.raises(ConfigError, match="expected str, got bool False .*quote the value"):
        load_config(None, ["data.train=no"])


def test_an_error_about_a_huge_value_stays_short():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.n=" + "x" * 1_000_000])
    assert len(str(e.value)) < 400


# -- what `fastcrit train / sft / rm` write and read ---------------------------------------------


@pytest.mark.parametrize("command", ["train", "sft", "rm", "ctrl-synth", "critique"])
def test_an_output_dir_in_place_of_a_file_is_refused_before_launch(tmp_path, capsys, no_launch, command):
    f = tmp_path / "f"
    f.write_text("x")
    config = {"train": CONFIG, "sft": "configs/cpu/sft.yaml", "rm": "configs/cpu/ppo.yaml"}.get(
        command, "configs/cpu/ctrl.yaml"
    )
    for out in (f, f / "sub"):
        err = _error(capsys, [command, config, "--set", f"trainer.output_dir={out}"])
        assert f"trainer.output_dir: '{out}': {f} is a file, not a directory" in err


def test_an_output_dir_with_a_tilde_or_at_a_repository_root_is_refused(tmp_path, capsys, no_launch):
    err = _error(capsys, ["train", CONFIG, "--set", "trainer.output_dir=~/runs/x"])
    assert "'~' is not expanded here; write the full path" in err
    (tmp_path / ".git").mkdir()
    err = _error(capsys, ["train", CONFIG, "--set", f"trainer.output_dir={tmp_path}"])
    assert "is a git repository's root" in err


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("empty.jsonl", "", "is empty"),
        ("rows.csv", "prompt,answer\na,b\n", "expected a .jsonl"),
        ("one.json", '{"prompt": "a", "answer": "b"}', "expected a JSON array of objects"),
        ("adir.jsonl", None, "is a directory; give a data file"),
    ],
)
def test_a_bad_data_file_is_refused_before_the_warm_start(tmp_path, capsys, no_launch, name, content, expected):
    # each was found after the SFT warm start before (the loaders read data.train after it)
    p = tmp_path / name
    p.mkdir() if content is None else p.write_text(content)
    err = _error(capsys, ["train", CONFIG, "--set", f"data.train={p}", "--set", f"trainer.output_dir={tmp_path}/o"])
    assert err.startswith(f"fastcrit: config error: data.train: {p}") and expected in err


@pytest.mark.parametrize(
    "sets, rows, expected",
    [
        # rows keyed "question" where data.prompt_key is "prompt": every row skipped
        ([], [{"question": "a", "answer": "b"}] * 3, "no usable examples (first problem: "),
        (["data.strict=true"], [{"prompt": "a", "answer": "b"}, {"prompt": ""}], "1 row skipped and data.strict"),
    ],
)
@pytest.mark.parametrize("key", ["data.train", "data.val", "sft.data"])
def test_rows_the_loader_would_refuse_stop_the_run_before_launch(
    tmp_path, capsys, no_launch, sets, rows, expected, key
):
    # each stopped a rank after the model loaded and the SFT warm start ran (78 steps here)
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["train", CONFIG, "--set", f"{key}={p}", "--set", f"trainer.output_dir={tmp_path}/o"]
    for s in sets:
        argv += ["--set", s]
    err = _error(capsys, argv)
    assert err.startswith(f"fastcrit: data error: {p}") and expected in err, err


def test_preference_rows_are_read_before_the_reward_model_launches(tmp_path, capsys, no_launch):
    p = tmp_path / "prefs.jsonl"
    p.write_text(json.dumps({"prompt": "a", "chosen": "b"}) + "\n")  # no "rejected"
    argv = ["rm", CONFIG, "--set", "rm.steps=2", "--set", f"rm.data={p}", "--set", f"trainer.output_dir={tmp_path}/o"]
    err = _error(capsys, argv)
    assert err.startswith(f"fastcrit: data error: {p}") and "no usable preference pairs" in err, err


def test_a_model_directory_without_weights_is_refused(tmp_path, capsys, no_launch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    err = _error(capsys, ["gen", str(tmp_path), "--prompt", "hi"])  # a RuntimeError traceback before
    assert "MODEL: " in err and "holds no weights" in err
    assert main(["serve", str(tmp_path)]) == 2  # after a warning line on the tokenizer
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("fastcrit serve: could not load")


def test_a_resumed_run_with_an_unreadable_config_yaml_is_refused(tmp_path, capsys, no_launch):
    out = tmp_path / "run"
    (out / "checkpoints" / "step_1").mkdir(parents=True)
    (out / "checkpoints" / "step_1" / "COMPLETE").write_text("")
    for saved in ("- a list\n", "rollout: [\n"):
        (out / "config.yaml").write_text(saved)  # not compared before: the run continued unchecked
        err = _error(capsys, ["train", CONFIG, "--resume", str(out), "--set", "trainer.total_steps=3"])
        assert f"{out / 'config.yaml'}: the saved run's settings cannot be read" in err


# -- option values of the other commands -------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["gen", "tiny", "--prompt", "hi", "--n", "0"], "argument --n: must be >= 1, got 0"),
        (["gen", "tiny", "--prompt", "hi", "--max-new-tokens", "-1"], "argument --max-new-tokens: must be >= 1"),
        (["gen", "tiny", "--prompt", "hi", "--temperature", "-1"], "argument --temperature: must be >= 0.0"),
        (["plan", CONFIG, "--gpu-memory-gib", "0"], "must be a finite number > 0, got 0"),  # read as 80 before
        (["plan", CONFIG, "--gpu-memory-gib", "nan"], "argument --gpu-memory-gib"),
    ],
)
def test_bad_option_values_are_usage_errors(capsys, argv, expected):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and expected in capsys.readouterr().err


def test_plan_json_onto_a_directory_is_one_line(tmp_path, capsys):
    err = _error(capsys, ["plan", CONFIG, "--gpu-memory-gib", "80", "--json", str(tmp_path)])
    assert f"--json {tmp_path}: cannot write it" in err


def test_export_under_a_file_and_serve_on_a_bad_port_are_refused(tmp_path, capsys):
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"")
    (tmp_path / "f").write_text("x")
    err = _error(capsys, ["export", str(src), str(tmp_path / "f" / "out")])  # FileExistsError before
    assert f"{tmp_path / 'f'} is a file, not a directory" in err
    assert "--port 70000: must be in 0..65535" in _error(capsys, ["serve", "tiny", "--port", "70000"])


def test_sandbox_run_onto_a_directory_is_one_line(tmp_path, capsys):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": 1, "code": "print(1)", "kind": "stdio", "tests": []}) + "\n")
    err = _error(capsys, ["sandbox", "run", str(jobs), "--out", str(tmp_path)])  # IsADirectoryError before
    assert err.startswith(f"fastcrit sandbox run: --out {tmp_path}: cannot write it")
