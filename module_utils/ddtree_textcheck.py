# -*- coding: utf-8 -*-
"""Text judgement for generated model output (stdlib only).

``assess(text, ...)`` returns ``(verdict, reasons)`` where verdict is
``'ok'``, ``'degenerate'`` (the text shows a broken decoder: runs, loops,
special-token leaks, U+FFFD, empty output) or ``'wrong'`` (well-formed text
that fails a known-answer ``expect`` regex).  Reasons are short
machine-readable strings ``"<code>: <detail>"``.

The thresholds below were tuned against the good/bad corpus in
tests/unit/probe/test_probe_textcheck.py: legitimate short answers, code, JSON,
markdown tables, lists, song refrains, multilingual text and emphatic
punctuation must stay 'ok'.
"""

from __future__ import annotations

import math
import re
import unicodedata

# --- single character runs -------------------------------------------------
# '!' and '?' : "Wow!!!" is fine, the NaN-logits failure ("!!!!!!!!") is not.
CHAR_RUN_BANG = 6
# Other punctuation / symbols / emoji ("😂😂😂" is fine).
CHAR_RUN_SYMBOL = 10
# Characters people use for rulers and separators ("# -----", "=====", dotted leaders).
SEPARATOR_CHARS = set("-=_*#~.+/\\|<>:" "\u2500\u2501\u2550\u00b7\u2014\u2013\u2022")
CHAR_RUN_SEPARATOR = 100
# Letters ("Aaaaaargh", "ㅋㅋㅋㅋ") and digits (1000000000, 0.33333333333333).
CHAR_RUN_LETTER = 16
CHAR_RUN_DIGIT = 24
# A whole answer that is one repeated non-digit character at least this long.
ONLY_CHAR_MIN = 4

# --- word runs ("the the the the") -----------------------------------------
WORD_RUN = 4
# Words that people legitimately repeat ("ha ha ha ha", "la la la la").
INTERJECTIONS = frozenset(
    "ha haha he hee ho hey hi la na da no yes yeah oh ah um uh mm hmm bye go "
    "tick tock ding dong knock blah boom bang woof meow yo".split()
)
WORD_RUN_INTERJECTION = 12

# --- phrase loops (periodic text) ------------------------------------------
LOOP_MAX_UNIT = 200          # longest repeated unit examined, in characters
LOOP_REPEATS = 4             # back-to-back repeats that count as a loop ...
LOOP_MIN_SPAN = 40           # ... when the looping region is at least this long
LOOP_MANY_REPEATS = 10       # this many repeats is a loop whatever the span
LOOP_MIN_UNIT_LETTERS = 2    # a unit without letters (| --- |, 0, 0,) is not a phrase
TAIL_LOOP_REPEATS = 3        # stopped at max_tokens inside >= 3 repeats
TAIL_LOOP_MIN_SPAN = 24
TAIL_LOOP_NOLEN_FRACTION = 0.5   # without finish info: loop must cover half the text
TAIL_LOOP_NOLEN_MIN_SPAN = 80
LOOP_ANALYSE_CHARS = 8000   # only the last N characters are scanned for loops

# --- diversity ---------------------------------------------------------------
LOW_DIVERSITY_MIN_CHARS = 120    # non-space characters needed before judging
LOW_DIVERSITY_MAX_DISTINCT = 4
# Word diversity is Guiraud's index R = distinct / sqrt(total) over words with letters
# (markdown table rows are left out).  English prose sits around 4-8, code around 2-4.
LOW_WORD_DIVERSITY_MIN_WORDS = 40
LOW_WORD_DIVERSITY_MAX_R = 1.0

# --- word salad (fast garbage: ", the ;; of :: model... the the") ----------
# Stray punctuation tokens are whitespace-separated tokens made only of , . ; : ! ? - and
# dashes; the first token of a line (list bullets) and table rows (with |) do not count.
SALAD_MIN_WORDS = 20
SALAD_MAX_R = 2.3
SALAD_STRAY_PUNCT_RATIO = 0.08
_STRAY_PUNCT_RE = re.compile(r"^[-,.;:!?\u2026\u2013\u2014]+$")

# --- token ids ---------------------------------------------------------------
ID_ZERO_RUN = 6      # token id 0 is "!" in GPT-2 style vocabularies (NaN logits)
ID_RUN = 32          # any one id repeated back to back

# --- leaks -------------------------------------------------------------------
_SPECIAL_TOKEN_RE = re.compile(
    r"<\|(?:[a-z0-9_]+|[A-Z_]+)\|>|<unk>|<pad>|\[PAD\]|\[UNK\]|<mask>|\[MASK\]"
    r"|<\|reserved_special_token_\d+\|>|<start_of_turn>|<end_of_turn>"
)
_TRAILING_EOS = ("<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")
_BYTE_TOKEN_RE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# GPT-2 byte-level markers stuck to the previous character (HelloĠworld, fooĊbar).
_BPE_MARKER_RE = re.compile(r"(?<=\S)[\u0120\u010a]|[\u0120\u010a]{2,}")
BPE_MARKER_MIN = 2
# SentencePiece word prefix followed by a non-block character (▁the▁cat).
_SP_MARKER_RE = re.compile(r"\u2581(?=[^\s\u2581-\u2588])")
SP_MARKER_MIN = 2

REPLACEMENT_CHAR = "\ufffd"

_WORD_SPLIT_RE = re.compile(r"\s+")
_WORD_STRIP = "\"'`*_()[]{}<>.,;:!?\u201c\u201d\u2018\u2019\u00ab\u00bb-"
_EMPHASIS_STRIP = "*_`\"'\u201c\u201d\u2018\u2019 \t\r\n"


def _show(ch: str) -> str:
    if ch.isprintable() and not ch.isspace():
        return ch
    return "U+%04X" % ord(ch)


def _char_class_limit(ch: str) -> int:
    if ch in "!?\uff01\uff1f":
        return CHAR_RUN_BANG
    if ch in SEPARATOR_CHARS:
        return CHAR_RUN_SEPARATOR
    if ch.isdigit():
        return CHAR_RUN_DIGIT
    if ch.isalpha():
        return CHAR_RUN_LETTER
    return CHAR_RUN_SYMBOL


def _char_runs(text: str) -> list[str]:
    reasons = []
    seen = set()
    n = len(text)
    i = 0
    while i < n:
        ch = text[i]
        j = i + 1
        while j < n and text[j] == ch:
            j += 1
        run = j - i
        if not ch.isspace() and run >= _char_class_limit(ch) and ch not in seen:
            seen.add(ch)
            reasons.append("char_run: %r x %d" % (_show(ch), run))
        i = j
    return reasons


def _norm_word(w: str) -> str:
    return w.strip(_WORD_STRIP).lower()


def _word_runs(text: str) -> list[str]:
    words = [_norm_word(w) for w in _WORD_SPLIT_RE.split(text) if w]
    reasons = []
    seen = set()
    i = 0
    n = len(words)
    while i < n:
        w = words[i]
        j = i + 1
        while j < n and words[j] == w:
            j += 1
        run = j - i
        if w and any(c.isalpha() for c in w) and w not in seen:
            limit = WORD_RUN_INTERJECTION if w in INTERJECTIONS else WORD_RUN
            if run >= limit:
                seen.add(w)
                reasons.append("word_run: %r x %d" % (w[:40], run))
        i = j
    return reasons


def _primitive_period(unit: str) -> int:
    """Smallest p such that unit is a repetition of unit[:p]."""
    n = len(unit)
    for p in range(1, n // 2 + 1):
        if n % p == 0 and unit[:p] * (n // p) == unit:
            return p
    return n


def find_loops(text: str, max_unit: int = LOOP_MAX_UNIT) -> list[dict]:
    """All maximal periodic regions with a unit of >= 2 characters.

    Returns dicts: start, end (exclusive), unit, period, repeats (float).
    Comparison is case-insensitive.  Only regions repeating at least
    ``TAIL_LOOP_REPEATS`` times are returned.
    """
    s = text.lower()
    n = len(s)
    out = []
    for p in range(2, min(max_unit, n // 2) + 1):
        # One byte per position: 1 where s[i] == s[i + p]; loops are long runs of 1s.
        eq = bytes([a == b for a, b in zip(s, s[p:])])
        need = max(1, int((TAIL_LOOP_REPEATS - 1) * p))
        for m in re.finditer(b"\x01{%d,}" % need, eq):
            i, j = m.start(), m.end()
            span = (j - i) + p
            unit = s[i:i + p]
            if _primitive_period(unit) != p:
                continue
            out.append({"start": i, "end": j + p, "unit": text[i:i + p],
                        "period": p, "repeats": span / p})
    return out


def _display_unit(unit: str) -> str:
    """Rotate a loop unit so it starts at a word boundary ('o hell' -> 'hello')."""
    for k in range(1, len(unit)):
        if unit[k - 1].isspace() and not unit[k].isspace():
            return (unit[k:] + unit[:k]).strip()[:60]
    return unit.strip()[:60]


def _unit_letters(unit: str) -> int:
    return sum(1 for c in unit if c.isalpha())


def _loop_reasons(text: str, stopped_at_length: bool | None) -> list[str]:
    offset = max(0, len(text) - LOOP_ANALYSE_CHARS)
    body = text[offset:]
    loops = find_loops(body)
    reasons = []
    best = None
    tail_best = None
    stripped_len = len(body.rstrip())
    for lp in loops:
        if _unit_letters(lp["unit"]) < LOOP_MIN_UNIT_LETTERS:
            continue
        span = lp["end"] - lp["start"]
        if lp["repeats"] >= LOOP_MANY_REPEATS or (
                lp["repeats"] >= LOOP_REPEATS and span >= LOOP_MIN_SPAN):
            if best is None or span > best["end"] - best["start"]:
                best = lp
        # A loop reaching the end of the text (allowing a partial last repeat).
        if lp["end"] + lp["period"] >= stripped_len:
            if tail_best is None or span > tail_best["end"] - tail_best["start"]:
                tail_best = lp
    if best is not None:
        reasons.append("phrase_loop: %r x %.1f over %d chars" % (
            _display_unit(best["unit"]), best["repeats"], best["end"] - best["start"]))
    if tail_best is not None:
        span = tail_best["end"] - tail_best["start"]
        detail = "%r x %.1f" % (_display_unit(tail_best["unit"]), tail_best["repeats"])
        if stopped_at_length and tail_best["repeats"] >= TAIL_LOOP_REPEATS \
                and span >= TAIL_LOOP_MIN_SPAN:
            reasons.append("length_in_loop: stopped at max_tokens inside " + detail)
        elif stopped_at_length is None and tail_best["repeats"] >= TAIL_LOOP_REPEATS \
                and span >= TAIL_LOOP_NOLEN_MIN_SPAN \
                and span >= TAIL_LOOP_NOLEN_FRACTION * max(1, stripped_len):
            reasons.append("tail_loop: " + detail)
    return reasons


def _leak_reasons(text: str) -> list[str]:
    reasons = []
    stripped = text.rstrip()
    leaks = []
    for m in _SPECIAL_TOKEN_RE.finditer(stripped):
        tok = m.group(0)
        if tok in _TRAILING_EOS and m.end() == len(stripped):
            continue  # an end-of-sequence marker at the very end is harmless
        leaks.append(tok)
    if leaks:
        reasons.append("special_token: %s x %d" % (leaks[0], len(leaks)))
    byte_toks = _BYTE_TOKEN_RE.findall(text)
    if byte_toks:
        reasons.append("byte_token: %s x %d" % (byte_toks[0], len(byte_toks)))
    bpe = _BPE_MARKER_RE.findall(text)
    if len(bpe) >= BPE_MARKER_MIN:
        reasons.append("bpe_marker: %s x %d" % (_show(bpe[0][0]), len(bpe)))
    sp = _SP_MARKER_RE.findall(text)
    if len(sp) >= SP_MARKER_MIN:
        reasons.append("sentencepiece_marker: U+2581 x %d" % len(sp))
    return reasons


def _stray_punctuation(text: str) -> int:
    """Punctuation-only tokens inside lines (not list bullets, not table rows)."""
    n = 0
    for line in text.splitlines():
        if "|" in line:
            continue
        toks = line.split()
        n += sum(1 for x in toks[1:] if _STRAY_PUNCT_RE.match(x))
    return n


def _diversity_reasons(text: str) -> list[str]:
    reasons = []
    chars = [c for c in text if not c.isspace()]
    if len(chars) >= LOW_DIVERSITY_MIN_CHARS:
        distinct = set(chars)
        if len(distinct) <= LOW_DIVERSITY_MAX_DISTINCT and not all(
                c.isdigit() or c in ".,-xXbB" for c in distinct):
            reasons.append("low_char_diversity: %d distinct in %d chars" % (
                len(distinct), len(chars)))
    prose = "\n".join(line for line in text.splitlines() if "|" not in line)
    tokens = [x for x in _WORD_SPLIT_RE.split(prose) if x]
    words = [w for w in (_norm_word(x) for x in tokens)
             if w and any(c.isalpha() for c in w)]
    if not words:
        return reasons
    distinct = len(set(words))
    guiraud = distinct / math.sqrt(len(words))
    if len(words) >= LOW_WORD_DIVERSITY_MIN_WORDS and guiraud < LOW_WORD_DIVERSITY_MAX_R:
        reasons.append("low_word_diversity: %d distinct in %d words (R=%.2f)" % (
            distinct, len(words), guiraud))
    elif len(words) >= SALAD_MIN_WORDS and guiraud <= SALAD_MAX_R:
        stray = _stray_punctuation(prose)
        if stray / len(tokens) >= SALAD_STRAY_PUNCT_RATIO:
            reasons.append("word_salad: %d distinct in %d words (R=%.2f), %d stray "
                           "punctuation tokens" % (distinct, len(words), guiraud, stray))
    return reasons


def _id_reasons(output_ids) -> list[str]:
    reasons = []
    ids = list(output_ids or [])
    i = 0
    n = len(ids)
    reported = set()
    while i < n:
        v = ids[i]
        j = i + 1
        while j < n and ids[j] == v:
            j += 1
        run = j - i
        limit = ID_ZERO_RUN if v == 0 else ID_RUN
        if run >= limit and v not in reported:
            reported.add(v)
            reasons.append("token_id_run: id %s x %d" % (v, run))
        i = j
    return reasons


def expect_matches(text: str, expect: str) -> bool:
    """True when the whole answer (trimmed) matches ``expect``.

    Tolerated around the answer: whitespace, one trailing period, markdown
    emphasis / backticks / quotes wrapping the answer.
    """
    pattern = re.compile(expect, re.DOTALL)
    base = text.strip()
    candidates = [base]
    unwrapped = base.strip(_EMPHASIS_STRIP)
    candidates.append(unwrapped)
    for c in list(candidates):
        if c.endswith("."):
            candidates.append(c[:-1].rstrip())
            candidates.append(c[:-1].strip(_EMPHASIS_STRIP))
    return any(pattern.fullmatch(c) for c in candidates)


def assess(text, *, prompt=None, expect=None, output_ids=None,
           finish_reason=None, max_tokens=None):
    """Judge one generated answer.  Returns (verdict, reasons)."""
    del prompt  # accepted for API symmetry; the judgement is about the output
    if text is None:
        text = ""
    if not isinstance(text, str):
        text = str(text)
    text = unicodedata.normalize("NFC", text)
    reasons: list[str] = []
    stripped = text.strip()

    if not stripped:
        reasons.append("empty_output: %d chars" % len(text))
    else:
        nfffd = text.count(REPLACEMENT_CHAR)
        if nfffd:
            reasons.append("replacement_char: U+FFFD x %d" % nfffd)
        reasons.extend(_leak_reasons(text))
        reasons.extend(_char_runs(text))
        if (len(stripped) >= ONLY_CHAR_MIN and len(set(stripped)) == 1
                and not stripped[0].isdigit()
                and not any(r.startswith("char_run") for r in reasons)):
            reasons.append("only_char: %r x %d" % (_show(stripped[0]), len(stripped)))
        reasons.extend(_word_runs(text))
        stopped_at_length = None
        if finish_reason is not None:
            fr = finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason
            stopped_at_length = str(fr).lower() == "length"
        if max_tokens and output_ids is not None and len(output_ids) >= int(max_tokens):
            stopped_at_length = True
        reasons.extend(_loop_reasons(text, stopped_at_length))
        reasons.extend(_diversity_reasons(text))
    reasons.extend(_id_reasons(output_ids))

    wrong: list[str] = []
    if expect:
        try:
            ok = expect_matches(text, expect)
        except re.error as exc:
            ok = False
            wrong.append("bad_expect_regex: %s" % exc)
        if not ok and not wrong:
            wrong.append("expect_mismatch: %r does not fully match /%s/" % (
                stripped[:80], expect))
    if reasons:
        return "degenerate", reasons + wrong
    if wrong:
        return "wrong", wrong
    return "ok", []
