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


SERVED_NAME = "tiny"  # the model id test_serve*.py's server answers to


@pytest.fixture(scope="module")
def server(tiny_model_path):
    """``fastcrit serve`` on the tiny model, for test_serve*.py (test_chat.py has its own)."""
    from fastcrit.rollout.serve import serve

    srv = serve(tiny_model_path, "127.0.0.1", 0, max_batch=16, served_model_name=SERVED_NAME)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(server):
    """The openai client on ``server``."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
