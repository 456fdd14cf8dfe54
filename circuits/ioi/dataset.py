"""The indirect object identification (IOI) dataset of Wang et al. 2022, for pretrained models.

    clean, abc, swap = make_ioi_dataset(model, n_prompts=100, seed=0)
    logits = model(clean.tokens)
    clean.logit_diff(logits).mean()  # logit(IO) - logit(S) at the last prompt token

Prompts look like "When Mary and John went to the store, John gave a drink to" (answer " Mary").
`abc` replaces IO, S1 and S2 by three other names (the paper's ABC distribution), `swap`
exchanges IO and S1; both keep the clean prompt's shape, positions and answer ids
(see interp.tasks.IOIPrompts).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch

from interp.tasks import IOI_ORDERS, IOI_POSITION_KEYS, IOIPrompts, ToyIOITask, ioi_prompt_template

# The paper's templates, in BABA order: [B] is the subject S, [A] the indirect object IO.
# ABBA versions swap the first [A] and [B].
BABA_TEMPLATES = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to [A]",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to [A]",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to [A]",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to [A]",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to [A]",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to [A]",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to [A]",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to [A]",
)

NAMES = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel",
    "David", "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin",
    "Sarah", "William", "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather",
    "Eric", "Elizabeth", "Adam", "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy",
    "Christina", "Kyle", "Rachel", "Laura", "Lauren", "Amber", "Brittany", "Danielle", "Richard",
    "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle", "Tiffany", "Jeremy", "Benjamin", "Mark",
    "Emily", "Aaron", "Charles", "Rebecca", "Jacob", "Stephen", "Patrick", "Sean", "Erin", "Jamie",
    "Kelly", "Samantha", "Nathan", "Sara", "Dustin", "Paul", "Angela", "Tyler", "Scott", "Katherine",
    "Andrea", "Gregory", "Erica", "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen",
    "Jose", "Alexander", "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine",
    "Alicia", "Cody", "Allison", "Bradley", "Samuel",
)  # fmt: skip
PLACES = (
    "store",
    "garden",
    "restaurant",
    "school",
    "hospital",
    "office",
    "house",
    "station",
)
OBJECTS = (
    "ring",
    "kiss",
    "bone",
    "basketball",
    "computer",
    "necklace",
    "drink",
    "snack",
)

# Held out: templates, names, places and objects that discovery never sees. A class found on the
# paper's distribution is validated on these (circuits.ioi.circuit.validate_circuit).
HELDOUT_TEMPLATES = (
    "Later, [B] and [A] walked into the [PLACE]. [B] handed a [OBJECT] to [A]",
    "Yesterday [B] and [A] cleaned the [PLACE], and then [B] passed the [OBJECT] to [A]",
    "On Sunday [B] and [A] visited the [PLACE]. [B] brought a [OBJECT] for [A]",
    "At the [PLACE], [B] and [A] found a [OBJECT]. [B] showed it to [A]",
    "In the morning [B] and [A] drove to the [PLACE], where [B] sold a [OBJECT] to [A]",
    "Before [B] and [A] left the [PLACE], [B] offered a [OBJECT] to [A]",
    "Once [B] and [A] arrived at the [PLACE], [B] lent the [OBJECT] to [A]",
    "Last year [B] and [A] worked at the [PLACE]. One day [B] mailed a [OBJECT] to [A]",
)
HELDOUT_NAMES = (
    "George", "Edward", "Henry", "Peter", "Frank", "Alice", "Helen", "Anna", "Emma", "Oliver", "Jack",
    "Harry", "Charlie", "Lucy", "Grace", "Sophie", "Kate", "Tom", "Sam", "Ben", "Max", "Leo", "Ruth",
    "Carl", "Victor", "Oscar", "Simon", "Martin", "Louis", "Arthur", "Albert", "Walter", "Philip",
    "Roger", "Julia", "Diana", "Rose", "Lily", "Chloe", "Jane", "Susan", "Karen", "Nancy", "Linda",
    "Carol", "Maria", "Anne", "Joan", "Paula", "Frances",
)  # fmt: skip
HELDOUT_PLACES = ("library", "museum", "park", "beach", "market", "kitchen", "church", "airport")
HELDOUT_OBJECTS = ("book", "letter", "cake", "flower", "pen", "hat", "key", "bag")
SPLITS = ("discovery", "heldout")

_SLOT = re.compile(r"\[(IO|S1|S2|PLACE|OBJECT)\]")
_NAME_ROLES = ("IO", "S1", "S2")


def single_token_names(model: Any, names: Sequence[str] = NAMES) -> dict[str, int]:
    """{name: token id} for the names that are one token with a leading space (" Mary")."""
    name_tokens = {}
    for name in names:
        try:
            name_tokens[name] = model.to_single_token(" " + name)
        except ValueError:
            continue
    return name_tokens


def make_ioi_dataset(
    model: Any,
    n_prompts: int,
    seed: int = 0,
    templates: Sequence[str] | None = None,
    names: Sequence[str] = NAMES,
    places: Sequence[str] = PLACES,
    objects: Sequence[str] = OBJECTS,
) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
    """(clean, abc, swap) IOI prompts tokenized for `model` (CPU tensors; use `.to(device)`).

    model: needs `tokenizer`, `to_tokens(texts)` (its BOS policy is kept) and `to_single_token`.
    templates: BABA-form templates (default: the paper's 15, `BABA_TEMPLATES`); each is used
    in both orders. Orders alternate ABBA, BABA, ...; templates, names (IO != S), places and
    objects are drawn with a torch.Generator seeded by `seed`.
    names: candidate names; only those that are a single token with a leading space are used.
    places, objects: fillers for [PLACE] and [OBJECT] (any number of tokens).
    """
    if n_prompts < 1:
        raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
    templates = BABA_TEMPLATES if templates is None else tuple(templates)
    if not places or not objects:
        raise ValueError("places and objects must each hold at least one word")
    if not templates:
        raise ValueError("templates is empty: pass at least one BABA-form template, or None for the paper's")
    prompt_templates = {order: [ioi_prompt_template(t, order) for t in templates] for order in IOI_ORDERS}
    for template in prompt_templates["BABA"]:
        if any(f" [{role}]" not in template for role in _NAME_ROLES):
            raise ValueError(f"names in IOI templates must follow a space (' [A]', ' [B]'); got {template!r}")
    if model.tokenizer is None:
        raise ValueError(
            "this model has no tokenizer, so text IOI prompts cannot be tokenized; models trained by "
            "`interp train --task ioi` get their prompts from ioi_dataset_for (interp.tasks.ToyIOITask)"
        )
    name_tokens = single_token_names(model, names)
    if len(name_tokens) < 5:
        raise ValueError(
            f"only {len(name_tokens)} of {len(names)} names are single tokens with a leading space in this "
            f"tokenizer ({sorted(name_tokens)}); IOI needs at least 5 (IO, S and three ABC names). "
            "Pass more names."
        )
    name_list = list(name_tokens)
    name_of_token = {token: name for name, token in name_tokens.items()}

    generator = torch.Generator().manual_seed(seed)
    template = torch.randint(len(templates), (n_prompts,), generator=generator)
    io_index, s_index = (
        torch.rand(n_prompts, len(name_list), generator=generator).topk(2, dim=1).indices.unbind(1)
    )
    place = torch.randint(len(places), (n_prompts,), generator=generator)
    obj = torch.randint(len(objects), (n_prompts,), generator=generator)
    order = [IOI_ORDERS[i % 2] for i in range(n_prompts)]
    fillers = [
        (prompt_templates[order[i]][template[i]], places[place[i]], objects[obj[i]]) for i in range(n_prompts)
    ]

    texts, slot_chars = [], []
    for i, (prompt_template, place_i, obj_i) in enumerate(fillers):
        io, s = name_list[io_index[i]], name_list[s_index[i]]
        text, chars = _render(prompt_template, {"IO": io, "S1": s, "S2": s}, place_i, obj_i)
        texts.append(text)
        slot_chars.append(chars)
    tokens, positions = _tokenize_with_positions(model, texts, slot_chars)
    io_token = torch.tensor([name_tokens[name_list[i]] for i in io_index])
    s_token = torch.tensor([name_tokens[name_list[i]] for i in s_index])
    for role, expected in (("IO", io_token), ("S1", s_token), ("S2", s_token)):
        found = tokens[torch.arange(n_prompts), positions[role]]
        if not torch.equal(found, expected):
            bad = int((found != expected).nonzero()[0])
            raise ValueError(
                f"{role} name in {texts[bad]!r} is not its single token in context "
                f"(found {model.tokenizer.decode([int(found[bad])])!r}); remove that name from `names`."
            )
    clean = IOIPrompts(tokens, io_token, s_token, positions, template, order, texts)

    def with_texts(prompts: IOIPrompts) -> IOIPrompts:
        rows = torch.arange(len(prompts))
        role_names = {role: prompts.tokens[rows, prompts.positions[role]].tolist() for role in _NAME_ROLES}
        texts = [
            _render(
                t,
                {role: name_of_token[role_names[role][i]] for role in _NAME_ROLES},
                p,
                o,
            )[0]
            for i, (t, p, o) in enumerate(fillers)
        ]
        return dataclasses.replace(prompts, texts=texts)

    abc = with_texts(clean.abc(list(name_tokens.values()), generator))
    return clean, abc, with_texts(clean.swap())


def _render(prompt_template: str, names: dict[str, str], place: str, obj: str) -> tuple[str, dict[str, int]]:
    """Fill a role-slot template; also return the character index of each name's leading space."""
    fill = {**names, "PLACE": place, "OBJECT": obj}
    text, chars, end = "", {}, 0
    for match in _SLOT.finditer(prompt_template):
        text += prompt_template[end : match.start()]
        if match[1] in names:
            chars[match[1]] = len(text) - 1  # the space before the name
        text += fill[match[1]]
        end = match.end()
    return text + prompt_template[end:], chars


def _tokenize_with_positions(
    model: Any, texts: list[str], slot_chars: list[dict[str, int]]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """model.to_tokens(texts) [batch, pos] and the token index of IO, S1, S1+1, S2, END per prompt."""
    tokenizer = model.tokenizer
    bodies = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    tokens = model.to_tokens(texts).cpu()
    n_prefix = tokens.shape[1] - max(len(body) for body in bodies)  # BOS tokens prepended by the model
    for text, row, body in zip(texts, tokens, bodies, strict=True):
        if (
            n_prefix < 0
            or row[n_prefix : n_prefix + len(body)].tolist() != body
            or not torch.equal(row[:n_prefix], tokens[0, :n_prefix])
        ):
            raise ValueError(
                f"model.to_tokens({text!r}) is not [BOS tokens] + tokenizer(text) right-padded; "
                "the IOI dataset needs that layout to locate the names."
            )
    positions = {key: torch.empty(len(texts), dtype=torch.long) for key in IOI_POSITION_KEYS}
    for i, (text, chars) in enumerate(zip(texts, slot_chars, strict=True)):
        for role, char in chars.items():
            positions[role][i] = n_prefix + len(tokenizer(text[:char], add_special_tokens=False)["input_ids"])
        positions["END"][i] = n_prefix + len(bodies[i]) - 1
    positions["S1+1"] = positions["S1"] + 1
    return tokens, positions


TOY_IOI_MODEL = "toy-ioi"  # cfg.model_name of models trained by `interp train --task ioi`
TOY_DISCOVERY_TEMPLATES = (0, 1, 2)  # ToyIOITask template indices; the others are held out


def ioi_dataset_for(
    model: Any, n_prompts: int, seed: int = 0, split: str = "discovery"
) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
    """(clean, abc, swap) IOI prompts for `model`, from the discovery or the held-out split.

    Text models: discovery uses the paper's templates, names, places and objects; heldout uses
    HELDOUT_TEMPLATES, HELDOUT_NAMES, HELDOUT_PLACES and HELDOUT_OBJECTS (disjoint from them).
    A model trained by `interp train --task ioi` (its vocabulary is closed): the toy task's eval
    prompts, discovery from templates TOY_DISCOVERY_TEMPLATES and the first half of the names,
    heldout from the other templates and names.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if model.cfg.model_name != TOY_IOI_MODEL:
        if split == "discovery":
            return make_ioi_dataset(model, n_prompts, seed)
        return make_ioi_dataset(
            model, n_prompts, seed, HELDOUT_TEMPLATES, HELDOUT_NAMES, HELDOUT_PLACES, HELDOUT_OBJECTS
        )
    task = ToyIOITask()
    if task.d_vocab != model.cfg.d_vocab:
        raise ValueError(
            f"this {TOY_IOI_MODEL} model has d_vocab {model.cfg.d_vocab}, but interp.tasks.ToyIOITask() has "
            f"{task.d_vocab} tokens: build its prompts with the ToyIOITask it was trained on and pass them "
            "to find_ioi_circuit(prompts=...)"
        )
    n_templates = len(task.templates["BABA"])
    half = len(task.name_tokens) // 2
    if split == "discovery":
        templates, names = TOY_DISCOVERY_TEMPLATES, task.name_tokens[:half]
    else:
        templates = [t for t in range(n_templates) if t not in TOY_DISCOVERY_TEMPLATES]
        names = task.name_tokens[half:]
    return task.make_dataset(n_prompts, seed, templates=templates, names=names)
