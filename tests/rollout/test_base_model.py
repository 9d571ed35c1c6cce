"""A base model, whose tokenizer has no chat template: `fastcrit serve` serves completions (what
lm-eval's loglikelihood tasks use) and answers chat with a 400 naming the reason (it refused to
start before), and training feeds it plain-text prompts after its BOS (it crashed in the chat
template before)."""

import shutil
import warnings

import pytest

from fastcrit.data.prompts import encode_chat, render_chat


@pytest.fixture(scope="module")
def base_dir(tiny_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("base") / "m"
    shutil.copytree(tiny_model_path, d)
    (d / "chat_template.jinja").unlink()
    return str(d)


def test_serve_gives_completions_and_refuses_chat_by_name(base_dir):
    openai = pytest.importorskip("openai")
    from fastcrit.rollout.serve import serve

    srv = serve(base_dir, "127.0.0.1", 0, max_batch=4, served_model_name="base")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        out = client.completions.create(model="base", prompt="reverse abc", max_tokens=4, temperature=0)
        assert out.choices[0].finish_reason in ("stop", "length")
        scored = client.completions.create(model="base", prompt="a b c", max_tokens=0, echo=True, logprobs=0)
        assert scored.choices[0].logprobs.token_logprobs[0] is None
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            client.chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    finally:
        srv.close()


def test_training_prompts_are_plain_text_after_bos(base_dir):
    from fastcrit.models.hf import load_tokenizer

    tok = load_tokenizer(base_dir)
    assert not tok.chat_template
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        text = render_chat(tok, "reverse abc", system="Answer briefly.")
        assert text == "Answer briefly.\n\nreverse abc"
        assert encode_chat(tok, "reverse abc") == tok.encode("reverse abc", add_special_tokens=False)  # no BOS
        tok.bos_token = tok.eos_token  # a tokenizer whose encoder puts a BOS first (Llama's)
        tok._tokenizer.post_processor = __import__("tokenizers").processors.TemplateProcessing(
            single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)]
        )
        assert encode_chat(tok, "reverse abc") == [tok.bos_token_id] + tok.encode(
            "reverse abc", add_special_tokens=False
        )
        with pytest.raises(ValueError, match=r"no chat template .* roles \['user', 'assistant', 'user'\]"):
            render_chat(
                tok,
                [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"},
                ],
            )
