"""The option letter a model's free-text answer picks: one extractor for every MCQ dataset.

Models write MCQ answers in many forms: a bare letter, ``**B**``, ``(c)``, ``B. Pleural
effusion``, a reasoning chain that weighs (and rejects) options before concluding, a
``<think>...</think>`` block followed by the answer, ``<answer>B</answer>``, ``\\boxed{B}``,
JSON ``{"answer": "B"}``, a final line in another language. :func:`extract_choice` reads them
in this order:

1. Reasoning is dropped: ``<think>...</think>`` blocks (also ``<thinking>``, ``<reasoning>``),
   and everything before a lone ``</think>`` (the opening tag sits in the prompt template);
   an unclosed ``<think>`` hides the rest of the text. Markdown emphasis is ignored.
2. Explicit final answers, the LAST one in the text that names an option wins over earlier
   ones and over every other mention: ``<answer>X</answer>``, ``\\boxed{X}``, JSON
   ``"answer"``/``"final_answer"``/``"choice"`` values, and cue phrases followed by the
   answer: "Answer: X", "Final answer: X", "The (correct|best|final) answer is (X)", "The
   correct option is X", "I choose X", "X is the correct answer", "option X fits best", "So
   X." (a letter only), and
   their Spanish, French,
   German, Italian, Portuguese, Russian, Chinese, Japanese and Korean equivalents.
3. Without an explicit answer: the whole answer when it is a letter form (``B``, ``(b)``,
   ``B. text``, ``C) text``), else its last non-empty line when that is one.
4. A hedged conclusion, the last one that names a letter at its start without rejecting it:
   "I think C, not B", "Probably D.", "The findings suggest B", "It's most likely A" (letters
   only; "I think C is unlikely" names nothing).
5. Option text, only inside the final answer segment (the explicit answer's segment, else the
   last line): equal to one option's text, or containing exactly one option's text (several
   contained: the one whose text contains all the others), so options weighed in the
   reasoning above never count.

The segment after a cue is read from its start: a letter there (``(C) because ...``, ``B.
Pleural effusion``) is the answer; a lower-case letter only when bracketed, alone or followed by
``.``/``)``/``:`` ("the answer is a pleural effusion" names no letter), a capital ``A`` followed by a word only
when that word is a connective ("A because ...", "A since ...") or its own option text; two letters joined
("A and C", "B/D") are ambiguous. A letter outside the options is still the answer (wrong).

:func:`extract_choice` returns the letter and how it was found (``how``), or ``None`` and
``"unparsed"``; the scorer counts unparsed answers and shows examples (``mcq_unparsed``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

LETTERS = "ABCDEFGHIJ"

_THINK = re.compile(r"<(think|thinking|reasoning|reason)>.*?</\1>", re.IGNORECASE | re.DOTALL)
_THINK_OPEN = re.compile(r"<(?:think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>", re.IGNORECASE)
_MARKUP = re.compile(r"\*\*|__|[*`#]")
_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.IGNORECASE | re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
_JSON_KEY = re.compile(
    r"[\"'](?:final_answer|answer|choice|option|prediction|selected_option)[\"']\s*:\s*"
    r"(?:\"([^\"]*)\"|'([^']*)'|([A-Ja-j])\b)",
    re.IGNORECASE,
)

# cue phrases that introduce the answer, then a connector (":", "is", "would be", ...)
_CUE_WORDS = (
    r"(?:(?:my|the|our)\s+)?(?:final|correct|best|right|most\s+(?:likely|appropriate))?\s*"
    r"(?:answer|option|choice)"
    r"|(?:final|most\s+likely|correct)\s+diagnosis"
    r"|respuesta(?:\s+correcta)?|r[ée]ponse(?:\s+correcte)?|antwort|risposta(?:\s+corretta)?"
    r"|resposta(?:\s+correta)?|ответ|правильный\s+ответ"
)
_CONNECT = (
    r"(?:\s*(?:(?:is|was|(?:would|should|will|might|may|must)\s+be|(?:seems|appears)\s+to\s+be|"
    r"es|est|ist|è|é)(?!\w)|=|:|：|-|–|—)"
    r"(?:\s+(?:therefore|thus|likely|probably|clearly|definitely|most\s+likely|option|choice|"
    r"letter|la|le|die|der|el|the))*\s*[:：]?\s*)"
)
_CUE = re.compile(
    r"(?<![\w])(?:" + _CUE_WORDS + r")" + _CONNECT + r"(?=(?P<seg>[^\n]*))", re.IGNORECASE
)
_CJK_CUE = re.compile(
    r"(?:最终答案|正确答案|答案|正解|回答|정답|답)\s*(?:是|为|為|は|：|:|=)?\s*[:：]?\s*(?=(?P<seg>[^\n]*))"
)
_CHOOSE = re.compile(
    r"(?<![\w])(?:I(?:'d|\s+would|\s+will)?\s+(?:choose|select|pick|go\s+with)|"
    r"(?:choose|select|pick)\s*:)\s*(?:option|choice|answer)?\s*(?=(?P<seg>[^\n]*))",
    re.IGNORECASE,
)
# "So B.", "Therefore, (C)": a conclusion naming a letter (a letter only, never option text)
_CONCLUDE = re.compile(
    r"(?<![\w])(?:so|thus|therefore|hence)\s*,?\s+(?:it(?:'s|\s+is)\s+)?(?=(?P<seg>[^\n]*))",
    re.IGNORECASE,
)
_BARE_LETTER = re.compile(
    r"^\s*(?:(?i:the\s+answer\s+is|option|choice|answer)\s+)?[\(\[]?([A-J])[\)\]]?\s*[.!。]?\s*$"
)
# "B is the correct answer", "Option (C) is correct", "(D) is the best option"
_LETTER_FIRST = re.compile(
    r"(?<![\w])(?:option\s+|choice\s+)?[\(\[]?(?P<letter>[A-J])[\)\]]?\s+"
    r"(?:(?:is|seems|appears)\s+(?:to\s+be\s+)?(?:the\s+)?"
    r"(?:correct|right|best|most\s+(?:likely|appropriate))"
    r"(?:\s+(?:answer|option|choice|diagnosis))?|fits\s+best)\b",
    re.IGNORECASE,
)
# a letter at the start of an answer segment
_LEAD = re.compile(
    r"^\s*(?:(?i:option|choice|letter)\s+)?"
    r"(?:[\(\[]\s*(?P<br>[A-Ja-j])\s*[\)\]]|(?P<up>[A-J])|(?P<low>[a-j]))"
    r"(?P<after>.*)$",
    re.DOTALL,
)
# words after a capital "A" that make it the letter, not the article ("A because ...")
_CONNECTIVES = frozenset(
    [
        "because",
        "since",
        "as",
        "given",
        "due",
        "which",
        "is",
        "was",
        "seems",
        "appears",
        "fits",
        "would",
        "should",
        "here",
        "from",
        "considering",
        "over",
        "rather",
        "not",
        "instead",
        "though",
        "although",
        "but",
        "while",
        "whereas",
        "best",
        "correct",
        "right",
        "for",
    ]
)
# a hedged or soft conclusion read only when no explicit answer is found: "I think C, not B",
# "Probably D.", "The findings suggest B", "It's most likely A"
_HEDGE = re.compile(
    r"(?<![\w])(?:I\s+(?:(?:would|'d)\s+)?(?:think|believe|guess|suspect|say|lean(?:ing)?\s+"
    r"(?:towards?|to))|I'm\s+(?:leaning\s+towards?|going\s+with)|"
    r"(?:most\s+)?(?:probably|likely)|my\s+(?:best\s+)?(?:guess|pick|vote)\s+(?:is|would\s+be)|"
    r"it(?:'s|\s+is|\s+would\s+be|\s+must\s+be)|"
    r"(?:suggests?|suggesting|indicates?|indicating|favou?rs?|favou?ring|points?\s+(?:to|towards)|"
    r"consistent\s+with|compatible\s+with|in\s+keeping\s+with|leaning\s+towards?))"
    r"(?:\s+(?:that|it(?:'s|\s+is)|this\s+is|the\s+answer\s+is|most\s+likely|likely|probably|"
    r"option|choice|answer))*\s*[:,]?\s*(?=(?P<seg>[^\n]*))",
    re.IGNORECASE,
)
# a letter followed by its own rejection: "C is unlikely", "B, no", "D is wrong"
_REJECTED = re.compile(
    r"^\s*(?:is|seems|appears|would\s+be|was)?\s*(?:not|unlikely|less|incorrect|wrong|"
    r"excluded|ruled|implausible)\b",
    re.IGNORECASE,
)
_JOINED = re.compile(r"^\s*(?:,|/|&|\band\b|\bor\b|\+)\s*[\(\[]?[A-Ja-j][\)\]]?(?:\W|$)", re.I)
_END_PUNCT = " \t.:;,!?。．：、"
_LATIN_WORD = re.compile(r"[A-Za-z0-9\u00c0-\u024f'’]")


@dataclass(frozen=True)
class Choice:
    """An extracted option letter (None: unparsed) and the rule that found it."""

    letter: str | None
    how: str


def strip_reasoning(text: str) -> str:
    """``text`` without ``<think>`` blocks (see the module docstring, rule 1)."""
    text = _THINK.sub(" ", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:  # a lone closing tag: what precedes it is reasoning
        text = text[closes[-1].end() :]
    m = _THINK_OPEN.search(text)
    if m:  # unclosed: the rest is reasoning that never reached an answer
        text = text[: m.start()]
    return text


def _norm(s: str) -> str:
    s = unicodedata.normalize("NFKC", s).lower()
    s = re.sub(r"[^\w\s]", " ", s)
    s = re.sub(r"\b(?:the|a|an)\b", " ", s)
    return " ".join(s.split())


def option_in_text(segment: str, options: Mapping[str, str]) -> str | None:
    """The one option whose text ``segment`` equals or contains as whole words (several
    contained: the one whose text contains all the others), else None."""
    p = _norm(segment)
    if not p:
        return None
    texts = {k: _norm(v) for k, v in options.items()}
    equal = [k for k, t in texts.items() if t and t == p]
    if len(equal) == 1:
        return equal[0]
    padded = f" {p} "
    hits = [k for k, t in texts.items() if t and f" {t} " in padded]
    if len(hits) == 1:
        return hits[0]
    covering = [k for k in hits if all(texts[j] in texts[k] for j in hits)]
    return covering[0] if len(covering) == 1 else None


def _valid(letter: str, options: Mapping[str, str] | None) -> bool:
    # a letter outside the options is still the model's answer (scored wrong, not unparsed)
    return letter in LETTERS


def lead_letter(segment: str, options: Mapping[str, str] | None = None) -> str | None:
    """The letter an answer segment starts with (see the module docstring), or None."""
    m = _LEAD.match(segment)
    if not m:
        return None
    after = m.group("after")
    if m.group("br"):
        letter = m.group("br").upper()
    else:
        raw = m.group("up") or m.group("low")
        letter = raw.upper()
        if _LATIN_WORD.match(after):  # "Both", "A's" (a CJK character may follow: "Dです")
            return None
        if re.match(r"[ \t]*(?:\n|$)", after):  # alone on its line: "A\nThe image shows ..."
            return letter if _valid(letter, options) else None
        rest = after.lstrip()
        spaced = after[:1].isspace() and bool(rest) and rest[0] not in ".)]:：-–—,;(\n"
        # "a pleural effusion", "A pleural effusion", "I think": an article or a pronoun,
        # unless that letter's own option text follows
        next_word = re.match(r"[^\W\d_]+", rest)
        connective = next_word is not None and next_word.group(0).lower() in _CONNECTIVES
        if (
            spaced
            and (raw.islower() or (raw in "AI" and rest[0].isalpha()))
            and not (raw == "A" and connective)
            and not (options and _starts_with_option(rest, options, letter))
        ):
            return None
    if _JOINED.match(after):
        return None
    return letter if _valid(letter, options) else None


def _starts_with_option(text: str, options: Mapping[str, str], letter: str) -> bool:
    t = _norm(options.get(letter, ""))
    return bool(t) and _norm(text).startswith(t)


def _read_segment(segment: str, options: Mapping[str, str] | None) -> str | None:
    """The letter an explicit answer's segment names: a letter at its start, a nested cue,
    else an option's text."""
    segment = _TEXT_CMD.sub(r"\1", segment).strip().strip("\"'“”")
    if not segment:
        return None
    letter = lead_letter(segment, options)
    if letter:
        return letter
    inner = _explicit(segment, options, nested=True)
    if inner:
        return inner[0]
    if options:
        return option_in_text(segment, options)
    return None


def _explicit(
    text: str, options: Mapping[str, str] | None, nested: bool = False
) -> tuple[str, str] | None:
    """(letter, form) of the last explicit answer in ``text`` that names an option."""
    found: list[tuple[int, str, str]] = []  # (position, form, segment or letter)
    if not nested:
        for m in _ANSWER_TAG.finditer(text):
            found.append((m.start(), "answer_tag", m.group(1)))
        for m in _BOXED.finditer(text):
            found.append((m.start(), "boxed", m.group(1)))
        for m in _JSON_KEY.finditer(text):
            found.append((m.start(), "json", next(g for g in m.groups() if g is not None)))
    for m in _CUE.finditer(text):
        found.append((m.start(), "cue", m.group("seg")))
    for m in _CJK_CUE.finditer(text):
        found.append((m.start(), "cue", m.group("seg")))
    for m in _CHOOSE.finditer(text):
        found.append((m.start(), "choose", m.group("seg")))
    for m in _CONCLUDE.finditer(text):
        found.append((m.start(), "conclusion", m.group("seg")))
    for m in _LETTER_FIRST.finditer(text):
        found.append((m.start(), "letter_is_correct", f"({m.group('letter')})"))
    for _, form, seg in sorted(found, key=lambda f: f[0], reverse=True):
        seg = seg.split("</answer>")[0] if form != "answer_tag" else seg
        if form == "conclusion":  # "So B." names B; "Thus, C is excluded." names nothing
            bare = _BARE_LETTER.match(seg)
            letter = bare.group(1) if bare else None
        else:
            letter = _read_segment(seg, options)
        if letter:
            return letter, form
    return None


def _hedged(text: str, options: Mapping[str, str] | None) -> str | None:
    """The letter of the last hedged conclusion ("I think C, not B", "Probably D") that names
    one at its start and does not reject it ("I think C is unlikely"), else None."""
    for m in reversed(list(_HEDGE.finditer(text))):
        seg = _TEXT_CMD.sub(r"\1", m.group("seg")).strip().strip("\"'“”")
        lead = _LEAD.match(seg)
        letter = lead_letter(seg, options)
        if letter and lead and not _REJECTED.match(lead.group("after")):
            return letter
    return None


def _json_answer(text: str) -> str | None:
    s = text.strip()
    if s.startswith("```"):
        s = s.strip("`").removeprefix("json").strip()
    if not (s.startswith("{") and s.endswith("}")):
        return None
    try:
        obj = json.loads(s)
    except json.JSONDecodeError:
        return None
    if isinstance(obj, dict):
        for key in ("final_answer", "answer", "choice", "option", "prediction"):
            v = obj.get(key)
            if isinstance(v, str):
                return v
    return None


def extract_choice(text: str, options: Mapping[str, str] | None = None) -> Choice:
    """The option letter ``text`` picks (see the module docstring), with the rule used."""
    if not isinstance(text, str):
        return Choice(None, "unparsed")
    body = _MARKUP.sub("", strip_reasoning(text))
    body = unicodedata.normalize("NFKC", body)
    if not body.strip():
        return Choice(None, "unparsed")
    js = _json_answer(body)
    if js is not None:
        letter = _read_segment(js, options)
        return Choice(letter, "json") if letter else Choice(None, "unparsed")
    got = _explicit(body, options)
    if got:
        return Choice(got[0], got[1])
    whole = body.strip().rstrip(_END_PUNCT) or body.strip()
    letter = lead_letter(whole, options)
    if letter:
        return Choice(letter, "letter")
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if len(lines) > 1:
        letter = lead_letter(last.rstrip(_END_PUNCT) or last, options)
        if letter:
            return Choice(letter, "last_line_letter")
    letter = _hedged(body, options)
    if letter:
        return Choice(letter, "hedged")
    if options:
        letter = option_in_text(last, options)
        if letter:
            return Choice(letter, "option_text")
    return Choice(None, "unparsed")


def extract_letter(text: str, options: Mapping[str, str] | None = None) -> str | None:
    """The option letter ``text`` picks, or None (:func:`extract_choice`)."""
    return extract_choice(text, options).letter
