"""Fixtures the native engine's test files share: a tiny model, its tokenizer, an engine, prompts."""

import pytest

from fastcrit.rollout.native import NativeEngine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from fastcrit.models.tiny import build_tiny_model
    from fastcrit.models.tokenizer import default_corpus

    d = str(tmp_path_factory.mktemp("tiny") / "m")
    return build_tiny_model(
        d,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=128,
        vocab_size=300,
        seed=1,
        corpus=default_corpus(use_human_eval=False),
    )


@pytest.fixture(scope="module")
def tok(model_dir):
    from fastcrit.models.hf import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture()
def engine(model_dir):
    return NativeEngine(model_dir)


@pytest.fixture(scope="module")
def prompts(tok):
    texts = ["reverse abc", "hi", "what is 12 + 35? answer with a number only", "x"]
    return [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, return_dict=False)
        for t in texts
    ]
