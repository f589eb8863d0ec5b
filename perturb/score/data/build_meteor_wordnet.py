"""Build perturb/score/data/wordnet_meteor.zip: WordNet 3.0 stripped to what METEOR reads.

nltk's METEOR only asks WordNet for ``synsets(word)`` and their ``lemma_names()``. This keeps the
files nltk's own ``WordNetCorpusReader`` needs for that (index.*, data.*, *.exc, lexnames) with
every synset's words, lexicographer file and type, and drops pointers, verb frames and glosses
(data offsets are renumbered consistently). The WordNet licence header stays on every data and
index file and the licence text is stored as LICENSE.

Usage (source: a WordNet 3.0 ``dict`` folder, e.g. Debian's wordnet-base, /usr/share/wordnet)::

    python perturb/score/data/build_meteor_wordnet.py /usr/share/wordnet perturb/score/data/wordnet_meteor.zip
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

POS = ("noun", "verb", "adj", "adv")
LEXNAMES = [
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
]
LEX_POS = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}


def strip_data(text: str) -> tuple[str, dict[int, int]]:
    """Stripped data file text and old offset -> new offset.

    Adjective satellites keep their ``&`` (similar-to) pointers: nltk names a satellite's lemmas
    after its head synset. Offsets are 8 digits, so line lengths do not depend on their values.
    """
    parsed: list[tuple[str, list[str], list[list[str]]] | str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("  "):
            parsed.append(line)
            continue
        cols = line.split(" | ", 1)[0].split()
        n_words = int(cols[3], 16)
        words = cols[4 : 4 + 2 * n_words]
        k = 4 + 2 * n_words
        n_ptr = int(cols[k])
        ptrs = [cols[k + 1 + 4 * j : k + 5 + 4 * j] for j in range(n_ptr)]
        keep = [q for q in ptrs if cols[2] == "s" and q[0] == "&"]
        parsed.append((line, [cols[0], cols[1], cols[2], cols[3], *words], keep))

    def render(head: list[str], ptrs: list[list[str]], remap: dict[int, int] | None) -> str:
        pt = [f"{q[0]} {(remap[int(q[1])] if remap else 0):08d} {q[2]} {q[3]}" for q in ptrs]
        off = f"{(remap[int(head[0])] if remap else 0):08d}"
        return " ".join([off, *head[1:], f"{len(ptrs):03d}", *pt]) + " | \n"

    remap: dict[int, int] = {}
    pos = 0
    for item in parsed:
        if isinstance(item, str):
            pos += len(item.encode("utf-8"))
        else:
            remap[int(item[1][0])] = pos
            pos += len(render(item[1], item[2], None).encode("utf-8"))
    out = [item if isinstance(item, str) else render(item[1], item[2], remap) for item in parsed]
    return "".join(out), remap


def strip_index(text: str, remap: dict[int, int]) -> str:
    """Index file with pointer symbols dropped and offsets renumbered."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("  "):
            out.append(line)
            continue
        t = line.split()
        lemma, pos, n_syn, n_ptr = t[0], t[1], int(t[2]), int(t[3])
        rest = t[4 + n_ptr :]
        offs = [f"{remap[int(o)]:08d}" for o in rest[2 : 2 + n_syn]]
        out.append(" ".join([lemma, pos, str(n_syn), "0", rest[0], rest[1], *offs]) + "  \n")
    return "".join(out)


def main(src: Path, dest: Path) -> None:
    files: dict[str, str] = {}
    for p in POS:
        data, remap = strip_data((src / f"data.{p}").read_text("utf-8"))
        files[f"data.{p}"] = data
        files[f"index.{p}"] = strip_index((src / f"index.{p}").read_text("utf-8"), remap)
        files[f"{p}.exc"] = (src / f"{p}.exc").read_text("utf-8")
    files["lexnames"] = "".join(
        f"{i:02d}\t{n}\t{LEX_POS[n.split('.')[0]]}\n" for i, n in enumerate(LEXNAMES)
    )
    lic = [ln[4:] for ln in files["data.adj"].splitlines() if ln.startswith("  ")]
    files["LICENSE"] = "\n".join(ln.rstrip() for ln in lic if ln.strip()) + "\n"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(f"wordnet/{name}", date_time=(2006, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name].encode("utf-8"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
