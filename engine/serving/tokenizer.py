"""Text <-> token ids for the server: the shipped byte-level BPE, or a local checkpoint's own.

The random-weight model has no tokenizer of its own, so the package ships one in
``engine/serving/tokenizer/`` as a standard Hugging Face ``tokenizer.json`` directory (any
HF-style client loads it with ``AutoTokenizer.from_pretrained(DIR)`` or
``tokenizers.Tokenizer.from_file``). It is a byte-level BPE trained, deterministically, from the
tiny ``corpus.txt`` beside it: byte-level means every string encodes and decodes back exactly,
whatever the corpus saw. ``python -m mixdiag.engine.serving.tokenizer`` rebuilds the file (a test
checks the shipped file equals a fresh build). Ids 0 and 1 are ``<|pad|>`` and ``<|endoftext|>``
(the tiny model's ``eos_token_id`` is 1).

Streaming: :class:`IncrementalDecoder` turns a growing list of ids into text deltas whose
concatenation equals ``decode(all ids)``; a delta that would end in half a UTF-8 character is held
back until the next id completes it (or the stream ends), as vLLM's detokenizer does.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mixdiag.errors import UserError

SHIPPED_DIR = Path(__file__).resolve().parent / "tokenizer"
SPECIAL_TOKENS = ("<|pad|>", "<|endoftext|>")
DEFAULT_VOCAB = 1024
_REPLACEMENT = "\ufffd"


def build(corpus: str, vocab_size: int = DEFAULT_VOCAB) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` ids trained on ``corpus`` (same input, same tokenizer)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus.splitlines(), trainer=trainer)
    return tok


def write_shipped(directory: Path = SHIPPED_DIR) -> Path:
    """(Re)build the shipped tokenizer from ``corpus.txt`` into ``directory``; returns tokenizer.json."""
    tok = build((SHIPPED_DIR / "corpus.txt").read_text(encoding="utf-8"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tok.save(str(path), pretty=True)
    cfg = ('{\n  "tokenizer_class": "PreTrainedTokenizerFast",\n  "pad_token": "<|pad|>",\n'
           '  "eos_token": "<|endoftext|>",\n  "bos_token": null,\n  "model_max_length": 16384,\n'
           '  "clean_up_tokenization_spaces": false\n}\n')
    (directory / "tokenizer_config.json").write_text(cfg, encoding="utf-8")
    return path


class TextTokenizer:
    """A loaded ``tokenizer.json``: encode/decode, checked against the model's vocabulary."""

    def __init__(self, directory: str | Path = SHIPPED_DIR, *, model_vocab_size: int | None = None):
        self.directory = Path(directory)
        path = self.directory / "tokenizer.json"
        if not path.is_file():
            raise UserError(f"{self.directory}: no tokenizer.json (a checkpoint directory must carry its tokenizer)")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # a damaged or foreign file: one line, not a Rust traceback
            raise UserError(f"{path}: not a readable tokenizer.json ({str(e).splitlines()[0]})") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        if model_vocab_size is not None and self.vocab_size > model_vocab_size:
            raise UserError(f"{path}: {self.vocab_size} token ids do not fit the model's vocabulary of "
                            f"{model_vocab_size}")
        self.eos_token_id = self._tok.token_to_id("<|endoftext|>")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def decoder(self) -> "IncrementalDecoder":
        return IncrementalDecoder(self)


class IncrementalDecoder:
    """Text deltas for a growing id list; ``"".join(deltas) == tokenizer.decode(ids)`` at the end."""

    def __init__(self, tokenizer: TextTokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._emitted = ""

    def push(self, new_ids: list[int], final: bool = False) -> str:
        """Add ids; return the text that became certain (everything left when ``final``)."""
        self._ids.extend(new_ids)
        text = self._tok.decode(self._ids)
        # Hold back a trailing partial character; the prefix already sent never changes with
        # byte-level BPE because each id decodes to fixed bytes.
        if not final:
            while text.endswith(_REPLACEMENT):
                text = text[:-1]
        if not text.startswith(self._emitted):   # a held-back char resolved into something else
            return ""
        delta = text[len(self._emitted):]
        self._emitted = text
        return delta

    @property
    def text(self) -> str:
        return self._emitted


if __name__ == "__main__":
    print(write_shipped())
