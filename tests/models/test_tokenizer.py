import random
import unicodedata

import pytest

from fastcrit.models.tokenizer import CHAT_TEMPLATE, IM_END, IM_START, PAD_TOKEN, default_corpus, train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(400, default_corpus(use_human_eval=False))


def _random_text(rng: random.Random, n: int) -> str:
    # Code points from every plane that are not surrogates (which UTF-8 cannot carry).
    out = []
    for _ in range(n):
        cp = rng.choice(
            [
                rng.randrange(0, 0x80),
                rng.randrange(0x80, 0x800),
                rng.randrange(0x800, 0xD800),
                rng.randrange(0xE000, 0x110000),
            ]
        )
        out.append(chr(cp))
    return "".join(out)


def test_roundtrip_arbitrary_unicode(tok):
    rng = random.Random(0)
    for _ in range(50):
        s = unicodedata.normalize("NFC", _random_text(rng, rng.randrange(1, 40)))
        assert tok.decode(tok.encode(s)) == s


def test_roundtrip_every_byte(tok):
    s = bytes(range(256)).decode("latin-1") + "\x00\ttab\r\n  spaces  \U0001f600 é 世界"
    ids = tok.encode(s)
    assert tok.decode(ids) == s
    assert tok.unk_token_id is None  # byte fallback is the alphabet itself, nothing maps to unk


def test_special_tokens_and_vocab(tok):
    assert len(tok) <= 400
    assert tok.pad_token == PAD_TOKEN and tok.eos_token == IM_END
    for t in (PAD_TOKEN, IM_START, IM_END):
        ids = tok.encode(t)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == t
    # Merges were learned: ordinary English compresses below one token per byte.
    text = "Answer the question and put the final answer on the last line."
    assert len(tok.encode(text)) < 0.6 * len(text.encode())


def test_chat_template(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_gen = tok.apply_chat_template(msgs[1:], tokenize=False, add_generation_prompt=False)
    assert no_gen == "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    assert ids == tok.encode(text) and tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids(IM_START)) == 3


def test_save_and_autotokenizer_roundtrip(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    rng = random.Random(1)
    samples = ["def f(x):\n    return x + 12345", "Overall judgment: Correct", IM_START + "user\nhé" + IM_END]
    samples += [_random_text(rng, 20) for _ in range(10)]
    for s in samples:
        assert again.encode(s) == tok.encode(s)
    assert again.eos_token_id == tok.eos_token_id and again.pad_token_id == tok.pad_token_id
    assert again.chat_template == CHAT_TEMPLATE


def test_training_is_deterministic_and_checks_size():
    corpus = default_corpus(use_human_eval=False)
    a, b = train_tokenizer(300, corpus), train_tokenizer(300, corpus)
    assert a.get_vocab() == b.get_vocab()
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_tokenizer(100, corpus)


def test_the_tiny_tokenizer_corpus_is_frozen():
    """Every tiny model, and every CPU config tuned on one, is built from this corpus: a change to a
    shipped task file must not reach it. Regenerating it (python -m fastcrit.models.tokenizer --freeze)
    changes all of them; update this hash only then, knowingly."""
    from fastcrit.models.tokenizer import corpus_hash

    assert corpus_hash(default_corpus()) == "036c0b5412f8748e"
