"""Deterministic filler text for the synthetic logs: prose, code, command output.

Everything is drawn from a small vocabulary with the ``random.Random`` handed to
:class:`Text`, so one seed always gives the same text. Also the small id, time and
JSON helpers the other synth modules share.
"""

from __future__ import annotations

import json
import random
import re
from datetime import datetime, timezone
from typing import Any

NOUNS = (
    "file directory function module test repository branch commit change error warning "
    "output input request response session user token cache prefix schema parameter "
    "argument value field record table query index result command process shell "
    "environment variable path pattern line column range buffer stream message block "
    "section document summary report issue ticket review patch diff dependency package "
    "version release build pipeline job step task agent tool model prompt context window "
    "limit budget timeout retry handler callback interface class method object instance "
    "type signature config migration endpoint service client server worker queue event "
    "log trace metric alert snapshot fixture mock assertion exception stack frame thread "
    "lock transaction connection cursor row key hash checksum archive image layer "
    "container volume secret credential permission role policy account workspace project"
).split()
ADJS = (
    "relevant existing current previous specific absolute relative optional required "
    "large small temporary persistent local remote new original exact partial complete "
    "empty invalid valid unique duplicate recent stale cached default explicit implicit "
    "nested sorted structured readable concise detailed unrelated failing passing broken "
    "generated deprecated internal external public private shared isolated minimal"
).split()
_VERB3 = (
    "reads writes returns updates creates deletes searches lists runs executes validates "
    "checks compares parses formats renders loads stores fetches sends receives tracks "
    "records reports replaces inserts removes resolves expands collects filters matches "
    "limits truncates preserves describes"
).split()
VERB_IMP = (
    "read write return update create delete search list run execute validate check compare "
    "parse format render load store fetch send track record report replace insert remove "
    "prefer avoid use include keep verify confirm inspect summarize explain mention quote "
    "batch group split"
).split()
_PREPS = "in from to for with before after inside across within against into over".split()
_SUBJ = ("the agent", "you", "this tool", "the command", "the user", "the harness", "the model", "the caller")
_WHEN = ("When", "If", "Before", "After", "Whenever", "Unless", "Once", "While")
_CONJ = ("and", "but", "so", "because", "while", "although", "unless", "since")
NAMES = (
    "Alice Chen", "Bruno Silva", "Chiara Rossi", "Dmitri Volkov", "Emeka Obi", "Fatima Zahra",
    "Gao Lei", "Hana Sato", "Ivan Petrov", "Jonas Berg", "Kavya Iyer", "Lena Fischer",
    "Mateo Garcia", "Nadia Haddad", "Oscar Lind", "Priya Nair", "Quentin Roy", "Rosa Diaz",
    "Sven Holm", "Tariq Aziz", "Uma Patel", "Victor Hugo", "Wen Li", "Yara Costa", "Zoe Martin",
)
CHAT_TOPICS = (
    "planning a trip to Lisbon", "a recipe for vegetable curry", "how compound interest works",
    "writing a cover letter", "the rules of cricket", "learning Spanish verbs",
    "fixing a slow laptop", "a birthday gift idea", "training for a 10k run",
    "understanding a rental contract", "a short poem about autumn", "choosing a houseplant",
    "explaining photosynthesis to a child", "budgeting for a wedding", "a polite email to a landlord",
)


# {slot} is a word of that list ({np}: a noun phrase); {slot^} capitalised
_WORDS = {"V": VERB_IMP, "V3": _VERB3, "P": _PREPS, "A": ADJS, "N": NOUNS, "W": _WHEN, "S": _SUBJ, "C": _CONJ}
_SLOT = re.compile(r"\{(np|V3|V|P|A|N|W|S|C)(\^?)\}")
_SENTENCES = (
    "{V^} {np} {P} {np}",
    "This tool {V3} {np} and {V3} {np} {P} {np}",
    "{W} {np} is {A}, {V} {np} {P} {np}",
    "Do not {V} {N}s {P} {np} unless the user explicitly asks you to",
    "{S^} {V3} {np}, {C} {S} {V3} {np}",
    "It is important to {V} {np} {P} {np} so that {S} {V3} {np}",
    "{np^} {V3} {np}",
)


class Text:
    """Prose, code and command output from a vocabulary (deterministic per rng)."""

    def __init__(self, rng: random.Random):
        self.r = rng

    def c(self, seq):
        return seq[self.r.randrange(len(seq))]

    def np_(self) -> str:
        r = self.r.random()
        if r < 0.45:
            return f"the {self.c(ADJS)} {self.c(NOUNS)}"
        if r < 0.75:
            return f"the {self.c(NOUNS)}"
        adj = self.c(ADJS)
        return f"{'an' if adj[0] in 'aeiou' else 'a'} {adj} {self.c(NOUNS)}"

    def sentence(self) -> str:
        template = _SENTENCES[self.r.randrange(len(_SENTENCES))]
        # slots are filled left to right, so one seed gives the same text as ever
        return _SLOT.sub(self._fill, template) + "."

    def _fill(self, slot: re.Match) -> str:
        name, capital = slot.group(1), slot.group(2)
        word = self.np_() if name == "np" else self.c(_WORDS[name])
        return word.capitalize() if capital else word

    def paragraph(self, lo=3, hi=6) -> str:
        return " ".join(self.sentence() for _ in range(self.r.randint(lo, hi)))

    def bullets(self, lo=3, hi=6) -> str:
        return "\n".join("- " + self.sentence() for _ in range(self.r.randint(lo, hi)))

    def prose(self, n_chars: int) -> str:
        out, size = [], 0
        while size < n_chars:
            p = self.paragraph() if self.r.random() < 0.65 else self.bullets()
            out.append(p)
            size += len(p) + 2
        return "\n\n".join(out)

    def ident(self) -> str:
        return f"{self.c(VERB_IMP)}_{self.c(ADJS)}_{self.c(NOUNS)}" if self.r.random() < 0.5 \
            else f"{self.c(VERB_IMP)}_{self.c(NOUNS)}"

    def path(self) -> str:
        d = self.c(("src", "lib", "app", "pkg", "tests", "services", "internal"))
        sub = self.c(NOUNS)
        ext = self.c((".py", ".py", ".py", ".ts", ".go", ".rs", ".md", ".toml"))
        return f"{d}/{sub}/{self.c(ADJS)}_{self.c(NOUNS)}{ext}"

    def code(self, n_lines: int) -> str:
        lines: list[str] = []
        while len(lines) < n_lines:
            fn = self.ident()
            args = ", ".join(self.c(NOUNS) for _ in range(self.r.randint(1, 3)))
            lines.append(f"def {fn}({args}, *, strict: bool = False) -> dict:")
            lines.append(f'    """{self.sentence()}"""')
            for _ in range(self.r.randint(2, 6)):
                k = self.r.randrange(5)
                a, b = self.c(NOUNS), self.c(NOUNS)
                if k == 0:
                    lines.append(f"    {a} = {self.ident()}({b}, limit={self.r.randint(1, 512)})")
                elif k == 1:
                    lines.append(f"    if not {a}.{self.c(ADJS)}:")
                    lines.append(f'        raise ValueError("{self.c(ADJS)} {b}: %r" % {a})')
                elif k == 2:
                    lines.append(f"    for {a} in {b}s:")
                    lines.append(f"        result[{a}.key] = {self.ident()}({a})")
                elif k == 3:
                    lines.append(f"    # {self.sentence()}")
                else:
                    lines.append(f"    {a}.{self.c(VERB_IMP)}({b}, strict=strict)")
            lines.append(f"    return {{\"{self.c(NOUNS)}\": {self.c(NOUNS)}, \"ok\": True}}")
            lines.append("")
        return "\n".join(lines[:n_lines])

    def numbered(self, code: str, start: int) -> str:
        return "\n".join(f"{start + i:6d}\t{ln}" for i, ln in enumerate(code.split("\n")))

    def command(self) -> str:
        k = self.r.randrange(7)
        if k == 0:
            return f"python -m pytest tests/test_{self.c(NOUNS)}.py -q -x"
        if k == 1:
            return "git status --short && git diff --stat"
        if k == 2:
            return f"grep -rn \"{self.ident()}\" src/ | head -20"
        if k == 3:
            return f"ls -la {self.c(('src', 'tests', 'lib', 'scripts'))}/{self.c(NOUNS)}"
        if k == 4:
            return "cargo build --release 2>&1 | tail -30" if self.r.random() < 0.3 else "make lint"
        if k == 5:
            return f"python scripts/{self.ident()}.py --dry-run"
        return f"npm test -- --grep \"{self.c(NOUNS)}\""

    def command_output(self, n_lines: int) -> str:
        k = self.r.randrange(4)
        out: list[str] = []
        if k == 0:
            n = self.r.randint(4, 60)
            out.append("============================= test session starts ==============================")
            out.append("platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0")
            out.append(f"collected {n} items")
            out.append("")
            while len(out) < n_lines - 2:
                out.append(f"tests/test_{self.c(NOUNS)}.py {''.join(self.c('....F.s') for _ in range(self.r.randint(3, 20)))}")
            f = self.r.randint(0, 3)
            if f:
                out.append(f"FAILED tests/test_{self.c(NOUNS)}.py::test_{self.ident()} - AssertionError: assert {self.r.randint(0, 9)} == {self.r.randint(10, 99)}")
            out.append(f"==== {f} failed, {n - f} passed in {self.r.uniform(0.2, 40):.2f}s ====")
        elif k == 1:
            while len(out) < n_lines:
                out.append(f"{self.path()}:{self.r.randint(1, 900)}:    {self.c(NOUNS)} = {self.ident()}({self.c(NOUNS)})")
        elif k == 2:
            out.append(f"total {self.r.randint(8, 400)}")
            while len(out) < n_lines:
                out.append(f"-rw-r--r--  1 dev dev {self.r.randint(80, 90000):6d} Nov {self.r.randint(1, 28):2d} "
                           f"{self.r.randint(0, 23):02d}:{self.r.randint(0, 59):02d} {self.c(ADJS)}_{self.c(NOUNS)}.py")
        else:
            while len(out) < n_lines:
                out.append(f" {self.path()} | {self.r.randint(1, 80):3d} {'+' * self.r.randint(0, 12)}{'-' * self.r.randint(0, 6)}")
        return "\n".join(out[:max(n_lines, 1)])


def hex_id(r: random.Random, n: int) -> str:
    return "".join(r.choice("0123456789abcdef") for _ in range(n))


def base62(r: random.Random, n: int) -> str:
    a = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return "".join(r.choice(a) for _ in range(n))


def uuid4_like(r: random.Random) -> str:
    h = hex_id(r, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[r.randrange(4)]}{h[17:20]}-{h[20:32]}"


def iso_ms(t: float) -> str:
    dt = datetime.fromtimestamp(round(t, 3), tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def iso_seconds(t: float) -> str:
    return datetime.fromtimestamp(int(t), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def compact(o: Any) -> str:
    return json.dumps(o, separators=(",", ":"), ensure_ascii=False)
