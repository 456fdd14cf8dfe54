"""A user's prompt-pair file (`interp circuit --task`, `interp patch --pairs`) is read as it is meant or
refused in one line naming the pair (counted from 1) and the column: repeated pairs, rows of more cells
than the header, a header naming a column twice, values that are not text, answers that are the same,
a family column of one family, and named positions (`pos:NAME`) that are not whole tokens of the clean
prompt. Everything the file alone shows is refused before a model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.edge_circuits.tasks import pair_edge_task
from circuits.path import pair_task
from interp.tasks.pairs import check_pairs, read_pairs

HEADER = "clean,corrupted,correct,incorrect"
PAIRS = [  # (clean, corrupted, correct, incorrect): distinct IOI-like pairs
    (f"When {a} and {b} went to the {place} , {a} gave a ring to",
     f"When {a} and {b} went to the {place} , {c} gave a ring to", f" {b}", f" {a}")
    for a, b, c in [("Mary", "John", "Kate"), ("Kate", "Mary", "John"), ("John", "Kate", "Mary")]
    for place in ("store", "school", "garden")
]  # fmt: skip
WORDS = ["When", "and", "went", "to", "the", "store", "school", "garden", ",", "gave", "a", "ring"]
WORDS += ["Mary", "John", "Kate"]


def csv_line(*cells: str) -> str:
    return ",".join(f'"{cell}"' if "," in cell else cell for cell in cells) + "\n"


def write_csv(path: Path, header: str, rows: list[tuple[str, ...]]) -> Path:
    path.write_text(header + "\n" + "".join(csv_line(*row) for row in rows), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def jsonl_rows(**changes) -> list[dict]:
    """The pairs as JSONL objects, each with a family; `changes`: {column: {pair index: value}}."""
    rows = [
        {"clean": clean, "corrupted": corrupted, "correct": correct, "incorrect": incorrect,
         "family": f"template {i % 4}"}
        for i, (clean, corrupted, correct, incorrect) in enumerate(PAIRS)
    ]  # fmt: skip
    for column, values in changes.items():
        for index, value in values.items():
            rows[index][column] = value
    return rows


@pytest.fixture(scope="module")
def word_model() -> interp.HookedTransformer:
    """A random 1-layer model with a word-level tokenizer (split at whitespace, decoded joined by
    spaces; BOS "<bos>"), as a user's own small model's."""
    vocab = {"<bos>": 0, "<pad>": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    word_level.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="<bos>", pad_token="<pad>", unk_token="<pad>"
    )
    cfg = interp.Config(n_layers=1, d_model=16, n_heads=2, d_vocab=len(vocab), n_ctx=32, bos_token_id=0)
    torch.manual_seed(0)
    return interp.HookedTransformer(cfg, tokenizer=tokenizer).eval()


# 1. Repeated pairs


def test_repeated_pairs_are_refused_naming_the_first_repeat(tmp_path, word_model):
    """Each pair written twice without a family column: split by prompts, copies of discovery pairs were
    held out (8 of 20 in the audit's file). Refused, with or without families, naming the rows."""
    twice = write_csv(tmp_path / "twice.csv", HEADER, [pair for pair in PAIRS for _ in range(2)])
    with pytest.raises(
        ValueError, match=r"9 pairs repeat an earlier pair \(the first: pair 2 repeats pair 1"
    ):
        check_pairs(read_pairs(twice), twice)
    with pytest.raises(ValueError, match="remove the repeats"):
        pair_task(word_model, twice)
    families = write_csv(
        tmp_path / "families.csv", HEADER + ",family", [(*PAIRS[0], "a"), *[(*p, "b") for p in PAIRS]]
    )
    with pytest.raises(
        ValueError, match="pair 2 repeats pair 1, the same clean, corrupted, correct, incorrect"
    ):
        check_pairs(read_pairs(families), families)
    # the same prompts with other answers are other pairs (in one family); with other named positions,
    # or one position written two ways (" Mary", " Mary#1"), the same pair: its effects are the same
    other = [PAIRS[0], (*PAIRS[0][:2], " Kate", " Mary"), *PAIRS[1:]]
    check_pairs(read_pairs(write_csv(tmp_path / "other.csv", HEADER, other)), "other.csv")
    for second in (" John", " Mary#1"):
        positions = [(*pair, " Mary") for pair in PAIRS[:3]] + [(*PAIRS[0], second)]
        path = write_csv(tmp_path / "pos.csv", HEADER + ",pos:X", positions)
        with pytest.raises(ValueError, match="pair 4 repeats pair 1"):
            check_pairs(read_pairs(path), path)
    # one clean prompt and its answers with two corruptions: one family, or they could choose and test
    clean, corrupted, correct, incorrect = PAIRS[0]
    again = (clean, corrupted.replace("Kate", "John"), correct, incorrect)
    labelled = [(*pair, f"T{i % 2}") for i, pair in enumerate([*PAIRS, again], 1)]
    for header, rows, where in [
        (HEADER, [*PAIRS, again], "no family column"),
        (HEADER + ",family", labelled, "families 'T1' and 'T0'"),
    ]:
        path = write_csv(tmp_path / "corruptions.csv", header, rows)
        with pytest.raises(
            ValueError,
            match=rf"pairs 1 and {len(PAIRS) + 1} have the same clean, correct, incorrect \({where}\)",
        ):
            check_pairs(read_pairs(path), path)
    rows = [(*pair, f"T{i % 2}") for i, pair in enumerate(PAIRS, 1)] + [(*again, "T1")]
    check_pairs(read_pairs(write_csv(tmp_path / "one.csv", HEADER + ",family", rows)), "one.csv")
    # the probability metric reads no incorrect answer: pairs that differ only there are repeats
    first = read_pairs(tmp_path / "other.csv")[0]
    rows = [first, {**first, "incorrect": " Kate"}]
    check_pairs(rows, "rows")
    with pytest.raises(ValueError, match=r"pair 2 repeats pair 1, the same clean, corrupted, correct\)"):
        check_pairs(rows, "rows", metric="prob")


# 2. Named positions cover whole tokens


@pytest.mark.parametrize("model_name", ["word_model", "smollm2"])
def test_named_positions_cover_whole_tokens(model_name, request, tmp_path):
    """`to#2` is the second " to" of the prompt, not the "to" inside " store" (it put END on ' store');
    a text that starts or ends inside a token is refused, naming the pair, the column and the prompt.
    Leading spaces, as the guide writes them (" lamps"), and none ("Mary") both name the word."""
    model = request.getfixturevalue(model_name)
    clean, corrupted, correct, incorrect = PAIRS[0]  # When Mary and John went to the store , Mary ...
    columns = {"pos:END": "to#2", "pos:S2": "Mary#2", "pos:IO": " John", "pos:S1": " Mary"}
    rows = [{"clean": c, "corrupted": k, "correct": y, "incorrect": n, **columns} for c, k, y, n in PAIRS[:3]]
    task = pair_task(model, rows)
    tokens = [model.to_str_tokens(task.clean[i]) for i in range(3)]
    for i in range(3):
        assert tokens[i][int(task.positions["END"][i])].strip() == "to"
        assert int(task.positions["END"][i]) == int(task.end[i])  # the last token: the second " to"
        assert tokens[i][int(task.positions["S2"][i])].strip() == "Mary"
        assert int(task.positions["S2"][i]) > int(task.positions["S1"][i])
        assert tokens[i][int(task.positions["IO"][i])].strip() == "John"
    for bad, found in [("to#3", "2 time"), ("Mar", "0 time"), ("ary", "0 time"), ("ore", "0 time")]:
        row = {**rows[0], "pos:END": bad}
        needle = bad.split("#")[0]
        with pytest.raises(
            ValueError,
            match=rf"pairs: pair 1's pos:END is '{bad}', but '{needle}' does not occur \d time\(s\) as "
            rf"whole tokens in the clean prompt '{clean}'.*it occurs {found}\(s\) as whole tokens and \d "
            "within longer tokens",
        ):
            pair_task(model, [row, *rows[1:]])


def test_named_positions_of_the_guides_file_are_its_words(smollm2):
    """The guide's agreement file names ` lamps` and ` letter`: each position is that word's token."""
    path = Path(__file__).parents[1] / "docs" / "guide" / "data" / "agreement.csv"
    rows = read_pairs(path)[:16]
    task = pair_task(smollm2, rows)
    for i, row in enumerate(rows):
        tokens = smollm2.to_str_tokens(task.clean[i])
        for name in ("subject", "attractor"):
            assert tokens[int(task.positions[name][i])] == row[f"pos:{name}"]


def test_a_named_position_not_in_the_clean_prompt_is_refused_when_read(tmp_path):
    path = write_csv(tmp_path / "pos.csv", HEADER + ",pos:END", [(*pair, "to") for pair in PAIRS[:2]])
    rows = read_pairs(path)
    rows[1]["pos:END"] = "Bob"
    with pytest.raises(
        ValueError, match=r"pair 2's pos:END is 'Bob', but 'Bob' does not occur 1 time\(s\) in the clean"
    ):
        check_pairs(rows, path)
    rows[1]["pos:END"] = "to#0"
    with pytest.raises(ValueError, match=r"pair 2's pos:END is 'to#0', not a position"):
        check_pairs(rows, path)


# 3. Extra cells and values that are not text


def test_a_row_of_more_cells_than_the_header_is_refused(tmp_path):
    rows = [(*pair, f"template {i}") for i, pair in enumerate(PAIRS[:3])]
    rows[2] = (*rows[2], "oops")
    path = write_csv(tmp_path / "extra.csv", HEADER + ",family", rows)
    with pytest.raises(
        ValueError, match=r"extra.csv: pair 3 has 6 cells, more than the 5 columns of the header \(clean, "
    ):
        read_pairs(path)


@pytest.mark.parametrize(
    ("column", "value", "what"),
    [("clean", 12345, "a number"), ("correct", [" John"], "a list"), ("incorrect", {"a": 1}, "an object"),
     ("pos:END", 3, "a number"), ("family", True, "a boolean"), ("stratum", [1], "a list")],
)  # fmt: skip
def test_values_that_are_not_text_are_refused_when_read(tmp_path, column, value, what):
    path = write_jsonl(tmp_path / "pairs.jsonl", jsonl_rows(**{column: {1: value}}))
    with pytest.raises(ValueError, match=rf"pairs.jsonl: pair 2's {column} is {what} \(.*\), not text"):
        read_pairs(path)


# 4. Families (and strata) that are JSON numbers


def test_families_written_as_numbers_are_their_text(tmp_path, word_model):
    """`"family": 0` was read as missing ("8 pairs lack a family")."""
    rows = jsonl_rows(
        family={i: i % 4 for i in range(len(PAIRS))}, stratum={i: i % 2 for i in range(len(PAIRS))}
    )
    path = write_jsonl(tmp_path / "numbers.jsonl", rows)
    read = read_pairs(path)
    assert [row["family"] for row in read] == [str(i % 4) for i in range(len(PAIRS))]
    check_pairs(read, path)
    task = pair_task(word_model, path)
    assert task.families == tuple(str(i % 4) for i in range(len(PAIRS)))
    assert task.strata == tuple(str(i % 2) for i in range(len(PAIRS)))
    assert set(task.family_split().discovery) | set(task.family_split().heldout) == {"0", "1", "2", "3"}
    floats = {i: i % 4 if i < 4 else float(i % 4) for i in range(len(PAIRS))}  # 1.0: a family of its own
    floats = write_jsonl(tmp_path / "floats.jsonl", jsonl_rows(family=floats))
    assert [row["family"] for row in read_pairs(floats)] == [str(i % 4) for i in range(len(PAIRS))]
    missing = write_jsonl(tmp_path / "missing.jsonl", jsonl_rows(family={3: None}))
    with pytest.raises(ValueError, match=r"1 pairs lack a family \(the unit held out; the first: pair 4\)"):
        check_pairs(read_pairs(missing), missing)
    strata = {i: i % 2 for i in range(len(PAIRS))} | {2: "", 5: None}  # an empty stratum was one named "all"
    missing = write_jsonl(tmp_path / "no-stratum.jsonl", jsonl_rows(stratum=strata))
    with pytest.raises(ValueError, match=r"2 pairs lack a stratum \(.*the first: pair 3\)"):
        check_pairs(read_pairs(missing), missing)


def test_a_family_written_with_surrounding_spaces_is_the_same_family(tmp_path, word_model):
    """ "T1" and " T1 " are one family: two would let prompts of one template choose the heads and test
    them; a family of spaces only is missing."""
    rows = jsonl_rows(
        family={i: ("T1" if i % 2 else " T1 ") if i < 4 else f"T{i}" for i in range(len(PAIRS))}
    )
    task = pair_task(word_model, write_jsonl(tmp_path / "spaces.jsonl", rows))
    assert task.families[:4] == ("T1",) * 4
    blank = write_jsonl(
        tmp_path / "blank.jsonl",
        jsonl_rows(family={i: f"T{i % 3}" if i else "  " for i in range(len(PAIRS))}),
    )
    with pytest.raises(ValueError, match=r"1 pairs lack a family \(the unit held out; the first: pair 1\)"):
        check_pairs(read_pairs(blank), blank)


def test_a_jsonl_line_may_hold_a_line_separator_in_a_string(tmp_path):
    """JSON strings may hold U+2028 and U+2029 unescaped; lines are split at newlines only."""
    rows = jsonl_rows(clean={0: "When Mary\u2028and John"})
    path = tmp_path / "separators.jsonl"
    path.write_text("\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n", encoding="utf-8")
    assert read_pairs(path)[0]["clean"] == "When Mary\u2028and John" and len(read_pairs(path)) == len(rows)


def test_families_shorter_than_the_file_keep_their_padding_exact(word_model):
    """A family whose prompts are all shorter than the file's longest: its subset's clean ids carry
    their exact padding, so runs (edges' mean ablation among them) do not guess it from pad ids,
    which counted the padding of a subset that no prompt fills as real tokens."""
    rows = [dict(zip(HEADER.split(","), pair, strict=True)) for pair in PAIRS]
    for i, row in enumerate(rows):
        row["family"] = "long" if i < 3 else "short"
        if i >= 3:  # every pair of the short family loses "went to the" from both prompts
            row["clean"], row["corrupted"] = (
                row[k].replace(" went to the", "") for k in ("clean", "corrupted")
            )
    task = pair_task(word_model, rows)
    short = task.subset([i for i, family in enumerate(task.families) if family == "short"])
    assert short.clean.shape[1] == task.clean.shape[1] - 3 and not bool(
        (short.end + 1 == task.clean.shape[1]).any()
    )
    edge_task = pair_edge_task(task).subset(torch.tensor([3, 4, 5]))
    assert edge_task.clean.shape[1] == task.clean.shape[1]  # not filled by any of these prompts
    torch.testing.assert_close(
        word_model.last_positions(edge_task.clean), task.end[3:6].to(word_model.device)
    )


# 5. A column named twice, answers that are the same


def test_a_column_named_twice_is_refused(tmp_path):
    path = write_csv(tmp_path / "twice.csv", HEADER + ",family,correct", [(*p, "t", p[3]) for p in PAIRS[:2]])
    with pytest.raises(ValueError, match=r"names the column 'correct' twice \(columns 3 and 6\)"):
        read_pairs(path)
    line = '{"clean": "a b", "corrupted": "a c", "correct": " b", "incorrect": " c", "correct": " c"}\n'
    (tmp_path / "twice.jsonl").write_text(line, encoding="utf-8")
    with pytest.raises(ValueError, match=r"twice.jsonl:1 names the key 'correct' twice"):
        read_pairs(tmp_path / "twice.jsonl")


def test_pairs_whose_answers_are_the_same_are_refused(tmp_path, word_model):
    """The logit difference of an answer with itself is 0: the run failed late ("Faithfulness is
    undefined: its denominator is 0"). Refused when read, and where two texts are one token."""
    rows = [*PAIRS[:2], (*PAIRS[2][:3], PAIRS[2][2])]
    path = write_csv(tmp_path / "same.csv", HEADER, rows)
    with pytest.raises(
        ValueError, match=r"1 pairs have the same correct and incorrect answer \(the first: pair 3"
    ):
        check_pairs(read_pairs(path), path)
    check_pairs(read_pairs(path), path, metric="prob")  # p(correct) reads no incorrect answer
    one_token = [*PAIRS[:2], (*PAIRS[2][:3], PAIRS[2][2].strip())]  # " John" and "John": one word token
    with pytest.raises(
        ValueError, match=r"pair 3's correct ' John' and incorrect 'John' answers are the same"
    ):
        pair_task(word_model, write_csv(tmp_path / "one.csv", HEADER, one_token))


def test_an_answer_of_several_tokens_is_refused_naming_its_pair_and_column(tmp_path, smollm2):
    rows = [*PAIRS[:2], (*PAIRS[2][:3], " aren't")]
    with pytest.raises(ValueError, match=r"pair 3's incorrect answer: .*aren't.* is 2 tokens"):
        pair_task(smollm2, write_csv(tmp_path / "long.csv", HEADER, rows))


# 6. One family


def test_a_family_column_of_one_family_is_refused_saying_so(tmp_path, word_model):
    path = write_csv(tmp_path / "one.csv", HEADER + ",family", [(*p, "only") for p in PAIRS])
    task = pair_task(word_model, path)
    with pytest.raises(
        ValueError, match=r"one.csv: its family column gives all 9 pairs one family \('only'\)"
    ) as error:
        task.family_split()
    assert "add a family column" not in str(error.value) and "drop the family column" in str(error.value)


# Everything the file shows, refused before a model loads


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    return {
        "twice": write_csv(tmp_path / "twice.csv", HEADER, [p for p in PAIRS for _ in range(2)]),
        "extra": write_csv(tmp_path / "extra.csv", HEADER, [PAIRS[0], (*PAIRS[1], "oops")]),
        "number": write_jsonl(tmp_path / "number.jsonl", jsonl_rows(clean={1: 12345})),
        "list": write_jsonl(tmp_path / "list.jsonl", jsonl_rows(correct={1: [" John"]})),
        "column": write_csv(tmp_path / "column.csv", HEADER + ",correct", [(*p, p[3]) for p in PAIRS]),
        "answers": write_csv(tmp_path / "answers.csv", HEADER, [(*p[:3], p[2]) for p in PAIRS]),
        "position": write_csv(tmp_path / "position.csv", HEADER + ",pos:X", [(*p, "Bob") for p in PAIRS]),
        "unnamed": write_csv(
            tmp_path / "unnamed.csv", HEADER + ",pos:", [(*p, p[0].split()[0]) for p in PAIRS]
        ),
        "all": write_csv(tmp_path / "all.csv", HEADER + ",pos:all", [(*p, p[0].split()[0]) for p in PAIRS]),
        "Family": write_csv(
            tmp_path / "Family.csv", HEADER + ",Family", [(*p, f"t{i % 2}") for i, p in enumerate(PAIRS)]
        ),
        "spaced": write_csv(tmp_path / "spaced.csv", HEADER + ", stratum", [(*p, "a") for p in PAIRS]),
    }


REFUSED = [
    ("twice", "9 pairs repeat an earlier pair (the first: pair 2 repeats pair 1"),
    ("extra", "pair 2 has 5 cells, more than the 4 columns of the header"),
    ("number", "pair 2's clean is a number (12345), not text"),
    ("list", "pair 2's correct is a list ([' John']), not text"),
    ("column", "the header names the column 'correct' twice (columns 3 and 5)"),
    ("answers", "9 pairs have the same correct and incorrect answer (the first: pair 1"),
    ("position", "pair 1's pos:X is 'Bob', but 'Bob' does not occur 1 time(s) in the clean prompt"),
    ("unnamed", "the column 'pos:' names no position; write pos:NAME"),
    ("all", "the column 'pos:all' names a position 'all', which means every position at once"),
    ("Family", "the column 'Family' is not read (column names are exact, lower case"),  # else no families
    ("spaced", "the column ' stratum' is not read"),
]


@pytest.mark.parametrize("command", ["circuit --task", "patch --pairs"])
@pytest.mark.parametrize(("file", "message"), REFUSED, ids=[file for file, _ in REFUSED])
def test_bad_pair_files_are_refused_before_a_model_loads(file, message, command, tmp_path, monkeypatch):
    import circuits.command as skeleton

    def load(model, dtype="float32"):
        raise AssertionError(f"{model} was loaded before the bad file was refused")

    monkeypatch.setattr(skeleton, "load", load)
    path = _bad_files(tmp_path)[file]
    result = CliRunner().invoke(app, [*command.split(), str(path), "--model", "toy-ioi"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())
    assert "Traceback" not in result.output
