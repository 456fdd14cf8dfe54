"""What the ICL score is measured on: documents of one length (no padding) and two windows of tokens.

The loss at token t is -log p(token t | the tokens before it), read at position t - 1 (BOS counted where
the model prepends one). `default_sequences` by model:
  a tokenizer                Brown corpus texts, tokens 475-525 vs 25-75 (Olsson et al.'s tokens 500 and
                             50, each averaged over 51 tokens; width=1 is their single-token definition)
  `interp train --task induction`   its repeated random sequences: the first copy vs the second
  `--task markov`            its in-context Markov chains: the first sixteenth of the context vs the last
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

import interp
from interp.checks import check_count, check_int
from interp.tasks.corpus import BROWN_SOURCE, brown_documents, document_tokens
from interp.tasks.synthetic import MarkovChainTask, repeated_sequences, split_generator

TEXT_WINDOWS = (50, 500, 51)  # (early, late, width) on natural text


@dataclass(frozen=True)
class Windows:
    """The early and late windows: `width` tokens centred on token `early` and on token `late`."""

    early: int
    late: int
    width: int

    def tokens(self, centre: int) -> range:
        """The window's token positions around `centre` (width tokens; one more after it if even)."""
        return range(centre - (self.width - 1) // 2, centre + self.width // 2 + 1)

    @property
    def n_tokens(self) -> int:
        """Tokens a document needs: up to the late window's last."""
        return self.late + self.width // 2 + 1

    def describe(self) -> str:
        """ "tokens 475-525 vs 25-75" (late vs early), or "token 500 vs 50" for one-token windows."""
        if self.width == 1:
            return f"token {self.late} vs {self.early}"
        early, late = self.tokens(self.early), self.tokens(self.late)
        return f"tokens {late[0]}-{late[-1]} vs {early[0]}-{early[-1]}"

    def check(self, n_ctx: int, n_tokens: int | None = None) -> None:
        """A ValueError saying what to pass where the windows overlap, start before token 1 or do not fit
        documents of `n_tokens` tokens (default: the context n_ctx)."""
        check_int(self.early, "early")
        check_int(self.late, "late")
        check_count(self.width, "window (tokens in each window)")
        first = self.tokens(self.early)[0]
        if first < 1:
            raise ValueError(
                f"the early window starts at token {first}, but token 0 has no prediction; "
                f"pass early >= {1 + (self.width - 1) // 2} or a narrower window"
            )
        if self.tokens(self.late)[0] <= self.tokens(self.early)[-1]:
            raise ValueError(
                f"the windows overlap ({self.describe()}): pass late >= early + window "
                f"({self.early + self.width})"
            )
        limit = n_ctx if n_tokens is None else min(n_ctx, n_tokens)
        if self.n_tokens > limit:
            what = (
                f"the model's context of {n_ctx}" if limit == n_ctx else f"the documents' {n_tokens} tokens"
            )
            raise ValueError(
                f"the late window ends at token {self.n_tokens - 1}, beyond {what}; "
                f"pass a smaller late (at most {limit - 1 - self.width // 2}) or window, or longer documents"
            )


@dataclass(kw_only=True)
class ICLSequences:
    """Documents [n_documents, n_tokens] to score, what they are, and the windows."""

    tokens: Int[Tensor, "n_documents n_tokens"]
    source: str
    names: list[str]  # one per document: the corpus text's id ("ca01"), or "sequence 3"
    windows: Windows


def default_windows(model: interp.HookedTransformer) -> Windows:
    """The windows of `default_sequences` for this model (the module docstring)."""
    cfg = model.cfg
    if model.tokenizer is not None:
        return Windows(*TEXT_WINDOWS)
    if cfg.task == "induction":
        bos = int(cfg.default_prepend_bos)
        half = (cfg.n_ctx - bos) // 2
        early = bos + half // 2
        return Windows(early, early + half, max(1, half - 2))
    if cfg.task == "markov":
        edge = max(1, cfg.n_ctx // 16)
        return Windows(edge + 1, cfg.n_ctx - 1 - edge, 2 * edge + 1)
    raise _no_sequences(model)


def _no_sequences(model: interp.HookedTransformer) -> ValueError:
    return ValueError(
        f"{model.cfg.model_name} has no tokenizer and was not trained on a task with repeated structure "
        f"(its task: {model.cfg.task}); the ICL score needs natural text or the induction or markov "
        "task's sequences: pass ICLSequences(tokens=..., windows=Windows(early, late, width), ...)"
    )


def default_sequences(
    model: interp.HookedTransformer, n_documents: int, seed: int = 0, windows: Windows | None = None
) -> ICLSequences:
    """`n_documents` sequences for the model (the module docstring) drawn with `seed`, cut to the
    windows' length (default: `default_windows`)."""
    check_count(n_documents, "n_documents (half find heads, half confirm them)", 4)
    cfg = model.cfg
    windows = default_windows(model) if windows is None else windows
    windows.check(cfg.n_ctx)
    generator = torch.Generator().manual_seed(seed)
    if model.tokenizer is not None:
        corpus = brown_documents()
        if n_documents > len(corpus):
            raise ValueError(f"the shipped corpus has {len(corpus)} documents; ask for at most that many")
        chosen = [corpus[i] for i in torch.randperm(len(corpus), generator=generator)[:n_documents].tolist()]
        tokens = document_tokens(model, [document.text for document in chosen], windows.n_tokens)
        return ICLSequences(tokens=tokens, source=BROWN_SOURCE, names=[d.id for d in chosen], windows=windows)
    eval_stream = split_generator(seed, "eval")
    if cfg.task == "induction":
        bos = cfg.bos_token_id if cfg.default_prepend_bos else None
        half = (cfg.n_ctx - int(bos is not None)) // 2
        tokens = repeated_sequences(cfg.d_vocab, half, n_documents, eval_stream, bos=bos)
        source = f"repeated random sequences of the induction task ({half} tokens, then again)"
    elif cfg.task == "markov":
        tokens = MarkovChainTask(cfg.d_vocab, cfg.n_ctx).sample(n_documents, eval_stream).tokens
        source = f"in-context Markov chains of the markov task ({cfg.d_vocab} states)"
    else:
        raise _no_sequences(model)
    windows.check(cfg.n_ctx, tokens.shape[1])
    return ICLSequences(
        tokens=tokens[:, : windows.n_tokens].to(model.device),
        source=source,
        names=[f"sequence {i}" for i in range(n_documents)],
        windows=windows,
    )
