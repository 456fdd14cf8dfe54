"""Indirect object identification (IOI, Wang et al. 2022): the text prompts of the paper for pretrained
models (`make_ioi_dataset`), and the prompts a model gets (`ioi_dataset_for`).

The IOI modules of interp.tasks: `ioi_prompts` (`IOIPrompts`, the prompt type every IOI prompt is),
`ioi_templates` (templates, names, places and objects, and which the discovery and held-out splits
use), `ioi_toy` (`ToyIOITask`: token ids over a closed vocabulary, for models we train) and this one.
`ioi_dataset_for(model, ...)` picks the prompts a model gets by the task it was trained on
(`model.cfg.task == "ioi"`: the toy task's closed vocabulary; otherwise text prompts).

    clean, abc, swap = ioi_dataset_for(model, n_prompts=64, seed=0)            # discovery split
    heldout, heldout_abc, _ = ioi_dataset_for(model, 64, seed=0, split="heldout")
    clean.logit_diff(model(clean.tokens)).mean()  # logit(IO) - logit(S) at the last prompt token

Prompts look like "When Mary and John went to the store, John gave a drink to" (answer " Mary").
`abc` replaces IO, S1 and S2 by three other names (the paper's ABC distribution), `swap`
exchanges IO and S1; both keep the clean prompt's shape, positions and answer ids.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from interp.tasks.ioi_prompts import IOI_POSITION_KEYS, IOIPrompts
from interp.tasks.ioi_templates import (
    BABA_TEMPLATES,
    HELDOUT_NAMES,
    HELDOUT_OBJECTS,
    HELDOUT_PLACES,
    HELDOUT_TEMPLATES,
    IOI_ORDERS,
    NAMES,
    OBJECTS,
    PLACES,
    TOY_DISCOVERY_TEMPLATES,
    ioi_prompt_template,
)
from interp.tasks.ioi_toy import ToyIOITask

_SLOT = re.compile(r"\[(IO|S1|S2|PLACE|OBJECT)\]")
_NAME_ROLES = ("IO", "S1", "S2")

# ---------------------------------------------------------------------------------------------
# The paper's text dataset, for pretrained models


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
    allow_duplicates: bool = False,
    balanced: bool = False,
) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
    """(clean, abc, swap) IOI prompts tokenized for `model` (CPU tensors; use `.to(device)`).

    1. each template in both orders, checked (`_prompt_templates`)
    2. the names that are single tokens (`_usable_names`)
    3. each prompt's order, template, names, place and object, repeats redrawn (`_draw_prompts`)
    4. the clean texts, tokenized, the names located and checked (`_clean_prompts`)
    5. the ABC and swapped prompts, with their texts (`_with_texts`)

    model: needs `tokenizer`, `to_tokens(texts)` (its BOS policy is kept) and `to_single_token`.
    templates: BABA-form templates (default: the paper's 15, `BABA_TEMPLATES`); each is used
    in both orders. Orders alternate ABBA, BABA, ...; templates, names (IO != S), places and
    objects are drawn with a torch.Generator seeded by `seed`.
    names: candidate names; only those that are a single token with a leading space are used.
    places, objects: fillers for [PLACE] and [OBJECT] (any number of tokens).
    allow_duplicates: the clean prompts are distinct unless this is True; asking for more prompts
    than there are distinct ones raises (the message gives their number).
    balanced: templates take turns instead of being drawn (prompts 2k and 2k + 1, one per order, use
    template k mod len(templates)), so every (template, order) stratum holds the same number of
    prompts, +-1: what validation per template and order needs.
    """
    prompt_templates = _prompt_templates(n_prompts, templates, places, objects)  # 1.
    name_tokens = _usable_names(model, names)  # 2.
    generator = torch.Generator().manual_seed(seed)
    draws = _draw_prompts(
        n_prompts, prompt_templates, len(name_tokens), places, objects, generator, balanced, allow_duplicates
    )  # 3.
    fillers = [
        (prompt_templates[draws.order[i]][draws.template[i]], places[draws.place[i]], objects[draws.obj[i]])
        for i in range(n_prompts)
    ]
    clean = _clean_prompts(model, draws, fillers, name_tokens)  # 4.
    name_of_token = {token: name for name, token in name_tokens.items()}
    abc = _with_texts(clean.abc(list(name_tokens.values()), generator), fillers, name_of_token)  # 5.
    return clean, abc, _with_texts(clean.swap(), fillers, name_of_token)


def _prompt_templates(
    n_prompts: int, templates: Sequence[str] | None, places: Sequence[str], objects: Sequence[str]
) -> dict[str, list[str]]:
    """1. order ("ABBA", "BABA") -> each template in that order's role slots (default templates:
    `BABA_TEMPLATES`); refuses no prompts, no places or objects, no templates, and names that do not
    follow a space."""
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
    return prompt_templates


def _usable_names(model: Any, names: Sequence[str]) -> dict[str, int]:
    """2. {name: token id} of the `names` that are single tokens with a leading space; refuses a model
    without a tokenizer, and fewer than 5 such names (IO, S and three ABC names)."""
    if model.tokenizer is None:
        raise ValueError(
            "this model has no tokenizer, so text IOI prompts cannot be tokenized; models trained by "
            "`interp train --task ioi` get their prompts from ioi_dataset_for (ToyIOITask)"
        )
    name_tokens = single_token_names(model, names)
    if len(name_tokens) < 5:
        raise ValueError(
            f"only {len(name_tokens)} of {len(names)} names are single tokens with a leading space in this "
            f"tokenizer ({sorted(name_tokens)}); IOI needs at least 5 (IO, S and three ABC names). "
            "Pass more names."
        )
    return name_tokens


@dataclasses.dataclass
class _Draws:
    """Each prompt's choices: its order ("ABBA", "BABA") and, as [n_prompts] indices, its template,
    IO and S names (of the usable names), place and object."""

    order: list[str]
    template: Tensor
    io_index: Tensor
    s_index: Tensor
    place: Tensor
    obj: Tensor


def _draw_prompts(
    n_prompts: int,
    prompt_templates: dict[str, list[str]],
    n_names: int,
    places: Sequence[str],
    objects: Sequence[str],
    generator: torch.Generator,
    balanced: bool,
    allow_duplicates: bool,
) -> _Draws:
    """3. Orders alternating ABBA, BABA; templates in turn (`balanced`) or drawn; two different names,
    a place and an object drawn, all with `generator`; repeated prompts redrawn unless
    `allow_duplicates` (`_redraw_duplicates`)."""
    n_templates = len(prompt_templates["BABA"])
    template = (
        torch.arange(n_prompts) // 2 % n_templates
        if balanced
        else torch.randint(n_templates, (n_prompts,), generator=generator)
    )
    io_index, s_index = torch.rand(n_prompts, n_names, generator=generator).topk(2, dim=1).indices.unbind(1)
    draws = _Draws(
        order=[IOI_ORDERS[i % 2] for i in range(n_prompts)],
        template=template,
        io_index=io_index,
        s_index=s_index,
        place=torch.randint(len(places), (n_prompts,), generator=generator),
        obj=torch.randint(len(objects), (n_prompts,), generator=generator),
    )
    if not allow_duplicates:
        _redraw_duplicates(
            draws, prompt_templates, n_names, places, objects, generator, redraw_template=not balanced
        )
    return draws


def _clean_prompts(
    model: Any, draws: _Draws, fillers: list[tuple[str, str, str]], name_tokens: dict[str, int]
) -> IOIPrompts:
    """4. The clean prompts: each filler (role-slot template, place, object) rendered with its drawn
    names, tokenized, the names located; refuses a name that is not its single token in context."""
    name_list = list(name_tokens)
    texts, slot_chars = [], []
    for i, (prompt_template, place_i, obj_i) in enumerate(fillers):
        io, s = name_list[draws.io_index[i]], name_list[draws.s_index[i]]
        text, chars = _render(prompt_template, {"IO": io, "S1": s, "S2": s}, place_i, obj_i)
        texts.append(text)
        slot_chars.append(chars)
    tokens, positions = _tokenize_with_positions(model, texts, slot_chars)
    io_token = torch.tensor([name_tokens[name_list[i]] for i in draws.io_index])
    s_token = torch.tensor([name_tokens[name_list[i]] for i in draws.s_index])
    for role, expected in (("IO", io_token), ("S1", s_token), ("S2", s_token)):
        found = tokens[torch.arange(len(texts)), positions[role]]
        if not torch.equal(found, expected):
            bad = int((found != expected).nonzero()[0])
            raise ValueError(
                f"{role} name in {texts[bad]!r} is not its single token in context "
                f"(found {model.tokenizer.decode([int(found[bad])])!r}); remove that name from `names`."
            )
    return IOIPrompts(tokens, io_token, s_token, positions, draws.template, draws.order, texts)


def _with_texts(
    prompts: IOIPrompts, fillers: list[tuple[str, str, str]], name_of_token: dict[int, str]
) -> IOIPrompts:
    """5. `prompts` (the clean prompts' ABC or swapped tokens) with their texts: each filler rendered
    with the names at the prompts' IO, S1 and S2 positions."""
    rows = torch.arange(len(prompts))
    role_names = {role: prompts.tokens[rows, prompts.positions[role]].tolist() for role in _NAME_ROLES}
    texts = [
        _render(t, {role: name_of_token[role_names[role][i]] for role in _NAME_ROLES}, p, o)[0]
        for i, (t, p, o) in enumerate(fillers)
    ]
    return dataclasses.replace(prompts, texts=texts)


def _redraw_duplicates(
    draws: _Draws,
    prompt_templates: dict[str, list[str]],
    n_names: int,
    places: Sequence[str],
    objects: Sequence[str],
    generator: torch.Generator,
    redraw_template: bool = True,
) -> None:
    """Redraw (in place, with `generator`) each prompt that repeats an earlier one (its template too
    unless `redraw_template` is False), so that the prompts are distinct; raise if there are fewer
    distinct prompts of an order than asked for."""
    order, template, io_index, s_index, place, obj = (
        draws.order, draws.template, draws.io_index, draws.s_index, draws.place, draws.obj
    )  # fmt: skip
    n_prompts = len(order)

    def fillers(prompt_template: str, slot: str, values: Sequence[str]) -> int:  # a slot it lacks: one text
        return len(set(values)) if f"[{slot}]" in prompt_template else 1

    def distinct(prompt_template: str) -> int:  # the prompts one template makes in one order
        return (
            n_names
            * (n_names - 1)
            * fillers(prompt_template, "PLACE", places)
            * fillers(prompt_template, "OBJECT", objects)
        )

    n_distinct = {o: sum(distinct(t) for t in set(prompt_templates[o])) for o in IOI_ORDERS}
    wanted = {o: sum(1 for x in order if x == o) for o in IOI_ORDERS}
    if any(wanted[o] > n_distinct[o] for o in IOI_ORDERS):
        total = sum(n_distinct[o] for o in IOI_ORDERS)
        raise ValueError(
            f"asked for {n_prompts} IOI prompts, but these templates, names, places and objects make only "
            f"{total} distinct prompts ({n_distinct['ABBA']} per order, and orders alternate); ask for at "
            f"most {2 * min(n_distinct.values())}, pass more templates, names, places or objects, or "
            "allow_duplicates=True"
        )
    if not redraw_template:  # each prompt keeps its template: each template's fillings must suffice
        for (o, t), count in sorted(Counter(zip(order, template.tolist(), strict=True)).items()):
            text = prompt_templates[o][t]
            if count > distinct(text):
                raise ValueError(
                    f"asked for {n_prompts} balanced IOI prompts: template {t} ({text!r}) gets "
                    f"{count} {o} prompts but makes only {distinct(text)} distinct ones; ask for fewer, pass "
                    "more names (or give the template a [PLACE] or [OBJECT]), or allow_duplicates=True"
                )

    def key(i: int) -> tuple:  # what the prompt's text reads: a place or object only where it has one
        prompt_template = prompt_templates[order[i]][template[i]]
        return (
            order[i],
            prompt_template,
            int(io_index[i]),
            int(s_index[i]),
            places[place[i]] if "[PLACE]" in prompt_template else None,
            objects[obj[i]] if "[OBJECT]" in prompt_template else None,
        )

    seen: set[tuple] = set()
    for i in range(n_prompts):
        while key(i) in seen:
            if redraw_template:
                template[i] = int(torch.randint(len(prompt_templates[order[i]]), (), generator=generator))
            io_index[i], s_index[i] = torch.randperm(n_names, generator=generator)[:2]
            place[i] = int(torch.randint(len(places), (), generator=generator))
            obj[i] = int(torch.randint(len(objects), (), generator=generator))
        seen.add(key(i))


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
) -> tuple[Tensor, dict[str, Tensor]]:
    """model.to_tokens(texts) [batch, pos] and the token index of IO, S1, S1+1, S2, END per prompt."""
    tokenizer = model.tokenizer
    bodies = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    n_ctx, longest = model.cfg.n_ctx, max(range(len(texts)), key=lambda i: len(bodies[i]))
    if len(bodies[longest]) + int(bool(model.cfg.default_prepend_bos)) > n_ctx:
        raise ValueError(
            f"the IOI prompt {texts[longest]!r} is {len(bodies[longest])} tokens long (plus BOS when the "
            f"model prepends one), longer than the model's context of {n_ctx}; pass shorter templates, "
            "places or objects"
        )
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


# ---------------------------------------------------------------------------------------------
# The dataset a model gets

IOI_SPLITS = ("discovery", "heldout")


def trained_on_ioi(model: Any) -> bool:
    """Whether `model` was trained on the toy IOI task (`interp train --task ioi`): its vocabulary is
    the toy task's, so it gets ToyIOITask prompts rather than text."""
    return model.cfg.task == "ioi"


def heldout_description(model: Any) -> str:
    """What `ioi_dataset_for(model, ..., split="heldout")` holds, in words (for reports)."""
    if trained_on_ioi(model):
        return "held-out toy templates and names (not used by discovery), each template in both orders"
    return "held-out templates, names, places and objects (interp.tasks.ioi_templates.HELDOUT_*)"


def ioi_dataset_for(
    model: Any, n_prompts: int, seed: int = 0, split: str = "discovery"
) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
    """(clean, abc, swap) IOI prompts for `model`, from the discovery or the held-out split.

    Text models: discovery uses the paper's templates, names, places and objects; heldout uses
    HELDOUT_TEMPLATES, HELDOUT_NAMES, HELDOUT_PLACES and HELDOUT_OBJECTS (disjoint from them), each
    held-out template in both orders equally often (`balanced`). Template indices run over
    BABA_TEMPLATES + HELDOUT_TEMPLATES (held-out template k is len(BABA_TEMPLATES) + k), so that the
    two splits' templates never share an index, as the toy task's share one list.
    A model trained on the toy IOI task (`model.cfg.task == "ioi"`; its vocabulary is closed): the
    toy task's eval prompts, discovery from templates TOY_DISCOVERY_TEMPLATES and the first half of
    the names, heldout from the other templates and names (so no held-out prompt is a discovery
    prompt), each held-out template in both orders equally often and no prompt twice (`balanced`;
    `heldout_description` says which in words).
    """
    if split not in IOI_SPLITS:
        raise ValueError(f"split must be one of {IOI_SPLITS}, got {split!r}")
    if not trained_on_ioi(model):
        if split == "discovery":
            return make_ioi_dataset(model, n_prompts, seed)
        heldout = make_ioi_dataset(
            model, n_prompts, seed, HELDOUT_TEMPLATES, HELDOUT_NAMES, HELDOUT_PLACES, HELDOUT_OBJECTS,
            balanced=True,
        )  # fmt: skip
        offset = len(BABA_TEMPLATES)
        return tuple(dataclasses.replace(prompts, template=prompts.template + offset) for prompts in heldout)
    task = ToyIOITask()
    if task.d_vocab != model.cfg.d_vocab:
        raise ValueError(
            f"this model was trained on the toy IOI task but has d_vocab {model.cfg.d_vocab}, while "
            f"ToyIOITask() has {task.d_vocab} tokens: build its prompts with the ToyIOITask it was trained "
            "on and pass them to find_ioi_circuit(prompts=...)"
        )
    half = len(task.name_tokens) // 2
    if split == "discovery":
        names = task.name_tokens[:half]
        return task.make_dataset(n_prompts, seed, templates=TOY_DISCOVERY_TEMPLATES, names=names)
    templates = [t for t in range(len(task.templates["BABA"])) if t not in TOY_DISCOVERY_TEMPLATES]
    names = task.name_tokens[half:]
    return task.make_dataset(n_prompts, seed, templates=templates, names=names, balanced=True)
