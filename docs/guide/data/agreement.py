"""Writes agreement.csv: subject-verb number agreement across an attractor noun, a task none of
interp's built-in analyses covers, as prompt pairs with families (the sentence frame), strata (the
subject's number) and named positions (the subject and the attractor).

    python docs/guide/data/agreement.py      # rewrites docs/guide/data/agreement.csv
"""

import csv
import random
from pathlib import Path

FRAMES = [
    "The {S} near the {A}", "The {S} of the {A}", "The {S} behind the {A}", "The {S} that the {A} saw",
    "The {S} with the {A}", "The {S} next to the {A}", "The {S} from the {A}", "The {S} above the {A}",
]  # fmt: skip
NOUNS = [  # each a single token of SmolLM2, singular and with -s
    "key", "dog", "book", "car", "girl", "boy", "tree", "house", "cat", "bird", "door", "table", "letter",
    "student", "teacher", "window", "flower", "chair", "friend", "road", "bottle", "picture", "farmer",
    "player", "writer", "doctor", "cup", "lamp", "river", "song",
]  # fmt: skip


def rows(per_frame: int = 12, seed: int = 0) -> list[dict[str, str]]:
    generator = random.Random(seed)
    out = []
    for frame in FRAMES:
        for i in range(per_frame):
            subject, attractor = generator.sample(NOUNS, 2)
            plural = i % 2 == 0  # the clean prompt's subject; the attractor has the other number
            singular, many = subject, subject + "s"
            clean_subject, corrupted_subject = (many, singular) if plural else (singular, many)
            noun = attractor if plural else attractor + "s"
            out.append({
                "clean": frame.format(S=clean_subject, A=noun),
                "corrupted": frame.format(S=corrupted_subject, A=noun),
                "correct": " are" if plural else " is",
                "incorrect": " is" if plural else " are",
                "family": frame.format(S="N", A="M"),
                "stratum": "plural subject" if plural else "singular subject",
                "pos:subject": " " + clean_subject,
                "pos:attractor": " " + noun,
            })  # fmt: skip
    return out


if __name__ == "__main__":
    table = rows()
    with (Path(__file__).parent / "agreement.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
