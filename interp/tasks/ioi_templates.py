"""The words of IOI prompts: templates, names, places and objects, for the toy task and for text,
and which of them the discovery and held-out splits use.

Templates are written in BABA order with [B] the subject S and [A] the indirect object IO, ending with
the answer: "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]". `ioi_prompt_template`
turns one into a prompt with role slots ([IO], [S1], [S2]) in either name order (`IOI_ORDERS`).

Splits: text discovery uses the paper's `BABA_TEMPLATES`, `NAMES`, `PLACES` and `OBJECTS`; the held-out
split uses `HELDOUT_*` (other templates, of other shapes, and other names, places and objects). The toy
task's discovery split uses `TOY_DISCOVERY_TEMPLATES` and the first half of its names, its held-out
split the other templates and names.
"""

from __future__ import annotations

IOI_ORDERS = ("ABBA", "BABA")


def ioi_prompt_template(template: str, order: str) -> str:
    """Turn a BABA-form IOI template into a prompt template with role slots.

    `template` names the subject [B] and the indirect object [A] in BABA order and ends with
    the answer, e.g. "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]".
    Returns the prompt without the answer, with [IO], [S1], [S2] slots in `order`:
    ABBA -> "Then, [IO] and [S1] went ... [S2] gave a [OBJECT] to".
    """
    if order not in IOI_ORDERS:
        raise ValueError(f"order must be one of {IOI_ORDERS}, got {order!r}")
    if template.count("[A]") != 2 or template.count("[B]") != 2 or not template.endswith("[A]"):
        raise ValueError(
            f"an IOI template needs [A] (the indirect object) twice, [B] (the subject) twice, "
            f"in BABA order, and must end with the answer [A]; got {template!r}"
        )
    prompt = template.removesuffix("[A]").rstrip()
    if prompt.index("[B]") > prompt.index("[A]"):
        raise ValueError(f"write IOI templates in BABA order ([B] before [A]); got {template!r}")
    first, second = ("[IO]", "[S1]") if order == "ABBA" else ("[S1]", "[IO]")
    prompt = prompt.replace("[B]", "\0", 1).replace("[A]", second, 1).replace("\0", first, 1)
    return prompt.replace("[B]", "[S2]", 1)


TOY_IOI_TEMPLATES = (
    "When [B] and [A] went to the [PLACE] , [B] gave a [OBJECT] to [A]",
    "Then , [B] and [A] went to the [PLACE] . [B] gave a [OBJECT] to [A]",
    "After [B] and [A] went to the [PLACE] , [B] gave it to [A]",
    "While [B] and [A] were at the [PLACE] , [B] handed the [OBJECT] over to [A]",
    "[B] and [A] met . [B] said hi to [A]",
)
TOY_IOI_NAMES = (
    "Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory", "Niaj",
    "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Uma", "Victor", "Walter", "Xena", "Yara", "Zoe", "Mary",
    "John", "Anna", "Paul", "Kate", "Mark", "Lucy", "Tom", "Rose",
)  # fmt: skip
TOY_IOI_SLOTS = ("[IO]", "[S1]", "[S2]", "[PLACE]", "[OBJECT]")
TOY_IOI_PLACES = ("store", "park", "school", "office", "garden", "station")
TOY_IOI_OBJECTS = ("drink", "book", "ring", "ball", "snack", "key")
TOY_DISCOVERY_TEMPLATES = (0, 1, 2)  # indices into TOY_IOI_TEMPLATES; the others are held out


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
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")

# Held out: templates, names, places and objects that circuit discovery never sees; a circuit found
# on the paper's distribution is validated on these (`ioi_dataset_for(..., split="heldout")`).
HELDOUT_TEMPLATES = (
    "Later, [B] and [A] walked into the [PLACE]. [B] handed a [OBJECT] to [A]",
    "Yesterday [B] and [A] cleaned the [PLACE], and then [B] passed the [OBJECT] to [A]",
    "On Sunday [B] and [A] visited the [PLACE]. [B] brought a [OBJECT] for [A]",
    "At the [PLACE], [B] and [A] found a [OBJECT]. [B] showed it to [A]",
    "In the morning [B] and [A] drove to the [PLACE], where [B] sold a [OBJECT] to [A]",
    "Before [B] and [A] left the [PLACE], [B] offered a [OBJECT] to [A]",
    "Once [B] and [A] arrived at the [PLACE], [B] lent the [OBJECT] to [A]",
    "Last year [B] and [A] worked at the [PLACE]. One day [B] mailed a [OBJECT] to [A]",
    # Other shapes: names introduced mid-sentence, by a verb rather than "and", in a subordinate
    # clause, or far from the end; the answer follows "for" or "with" as well as "to".
    "The [PLACE] was quiet when [B] and [A] arrived, so [B] left the [OBJECT] with [A]",
    "Once upon a time [B] met [A] at the [PLACE], and after a long talk [B] gave the [OBJECT] to [A]",
    "Because [B] and [A] were hungry after a day at the [PLACE], [B] bought a [OBJECT] for [A]",
    "It was [B] who invited [A] to the [PLACE], and it was [B] who threw the [OBJECT] to [A]",
    "Both [B] and [A] liked the [OBJECT] from the [PLACE], but in the end [B] gave it to [A]",
    "In the evening [B] phoned [A] from the [PLACE]. An hour later, [B] brought a [OBJECT] to [A]",
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
