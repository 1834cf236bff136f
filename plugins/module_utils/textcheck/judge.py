# -*- coding: utf-8 -*-
"""Text judgement for generated model output.

``assess(text, ...)`` returns ``(verdict, reasons)`` where verdict is
``'ok'``, ``'degenerate'`` (the text shows a broken decoder: runs, loops,
special-token and byte-marker leaks, mojibake, U+FFFD, word salad, a language
switch the prompt did not ask for, empty output) or ``'wrong'`` (well-formed
text that fails a known-answer ``expect`` regex).  Reasons are short
machine-readable strings ``"<code>: <detail>"``.

The judgement is prompt-aware: repetition the prompt asks for, markers the
prompt or the answer talks about (in code spans, quotes, or a question about
them), the prompt's own language and a requested translation are not
degenerate.  ``same_output_reasons(items)`` flags one non-trivial answer given
to different prompts (a server that ignores its prompt).

Runs with the standard library alone (on the target host, inside an Ansible
module).  Where ``ftfy`` (mojibake), ``pycld2`` (the language of a Latin-script
prompt and answer) and ``wordfreq`` (out-of-vocabulary words in English-looking
prose) can be imported - on the controller, from the project venv - they add
their judgement (imported on first use; ``use_libraries(False)`` or
DDTREE_TEXTCHECK_STDLIB_ONLY=1 turns them off); ``judges()`` says which judges
are in use.

The thresholds below were tuned against the good/bad cases in
tests/unit/probe/test_probe_textcheck.py and the labelled corpus
tests/data/textcheck_corpus.jsonl (tests/bench/textcheck_corpus.py): legitimate
short answers, code, JSON, markdown tables, lists, hex dumps, song refrains,
multilingual text and emphatic punctuation must stay 'ok'.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections import Counter
from itertools import groupby

# The optional judges (see above) are imported on first use: importing this module stays cheap.
_LIBS_ENABLED = os.environ.get("DDTREE_TEXTCHECK_STDLIB_ONLY", "") in ("", "0")
_LIBS: dict = {}


def _lib(name: str):
    """The optional module ``name`` (ftfy.badness, pycld2, wordfreq), or None."""
    if not _LIBS_ENABLED:
        return None
    if name not in _LIBS:
        try:
            import importlib
            _LIBS[name] = importlib.import_module(name)
        except Exception:  # ImportError, or a broken install: judge without it
            _LIBS[name] = None
    return _LIBS[name]


def use_libraries(enabled: bool = True) -> None:
    """Turn the optional library judges on or off (off = the host's stdlib path)."""
    global _LIBS_ENABLED
    _LIBS_ENABLED = bool(enabled)


def _version(dist: str) -> str:
    try:
        from importlib import metadata
        return metadata.version(dist)
    except Exception:
        return "?"


def judges() -> dict:
    """Which judges run.

    ``{'rules': 'stdlib', 'mojibake': 'ftfy 6.3.1' | 'stdlib', 'language': 'pycld2 0.42' |
    'stdlib', 'vocabulary': 'wordfreq 3.1.1' | 'stdlib', 'library_backed': bool}``
    """
    out = {"rules": "stdlib"}
    for key, mod, dist in (("mojibake", "ftfy.badness", "ftfy"), ("language", "pycld2", "pycld2"),
                           ("vocabulary", "wordfreq", "wordfreq")):
        out[key] = "%s %s" % (dist, _version(dist)) if _lib(mod) is not None else "stdlib"
    out["library_backed"] = any(v != "stdlib" for v in out.values())
    return out


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
ONLY_CHAR_MIN_WIDE = 3       # one CJK / Hangul character said three times and nothing else
PUNCT_ONLY_MIN = 8           # an answer made only of punctuation (",,,\n ,\n __")

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
# U+2581 runs standing in for spaces ("  ▁▁ three"), not part of a block-element sparkline.
_SP_SPACE_RE = re.compile(r"(?:(?<=\s)|^)\u2581+(?=\s|$)", re.M)
SP_MARKER_MIN = 2
# Chat-template role tags and their text, sentence markers.
_ROLE_TAG_RE = re.compile(
    r"\[/?(?:INST|SYS|USER|ASSISTANT|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CALLS|TOOL_RESULT|"
    r"SYSTEM_PROMPT)\]|<</?SYS>>|\[control_\d+\]|\[[A-Z][A-Z0-9]*_[A-Z0-9_]+\]"
    r"|<(?:EOS|BOS|SEP|CLS|PAD|UNK|MASK|EOP|EOD|SOS)(?:_TOKEN)?>|<[A-Z]+_TOKEN>"
    r"|<\uff5c[^<>\n]{1,40}\uff5c>")
_BOS_RUN_RE = re.compile(r"<s>\s*(?:<s>|\[)|</s>\s*</s>")
# Llama-3 header text left behind when the header special tokens are stripped:
# "...with?assistant\n\n".
_HEADER_LEAK_RE = re.compile(r"(?<=[a-z0-9.!?)\]\"'])(?:assistant|<\|assistant\|>)\n")
_MARKER_ANY_RE = re.compile("|".join([
    _SPECIAL_TOKEN_RE.pattern, _ROLE_TAG_RE.pattern, _BYTE_TOKEN_RE.pattern,
    r"<\|[A-Za-z_]+\|>", r"</?s>"]))

REPLACEMENT_CHAR = "\ufffd"

_WORD_STRIP = "\"'`*_()[]{}<>.,;:!?\u201c\u201d\u2018\u2019\u00ab\u00bb-"
_EMPHASIS_STRIP = "*_`\"'\u201c\u201d\u2018\u2019 \t\r\n"


def _show(ch: str) -> str:
    if ch.isprintable() and not ch.isspace():
        return ch
    return "U+%04X" % ord(ch)


def _run_reasons(items, code: str, limit, show) -> list[str]:
    """``code: show(item) x n`` for the first run of each item at least ``limit(item)`` long
    (an item whose limit is None is never reported)."""
    reasons, seen = [], set()
    for item, group in groupby(items):
        run = len(list(group))
        least = limit(item)
        if least is not None and run >= least and item not in seen:
            seen.add(item)
            reasons.append("%s: %s x %d" % (code, show(item), run))
    return reasons


def _char_limit(ch: str):
    if ch.isspace():
        return None
    if ch in "!?\uff01\uff1f":
        return CHAR_RUN_BANG
    if ch in SEPARATOR_CHARS:
        return CHAR_RUN_SEPARATOR
    if ch.isdigit():
        return CHAR_RUN_DIGIT
    if ch.isalpha():
        return CHAR_RUN_LETTER
    return CHAR_RUN_SYMBOL


def _norm_word(w: str) -> str:
    return w.strip(_WORD_STRIP).lower()


def _word_limit(w: str):
    if not any(c.isalpha() for c in w):
        return None
    return WORD_RUN_INTERJECTION if w in INTERJECTIONS else WORD_RUN


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
    out = []
    for p in range(2, min(max_unit, len(s) // 2) + 1):
        # One byte per position: 1 where s[i] == s[i + p]; loops are long runs of 1s.
        eq = bytes([a == b for a, b in zip(s, s[p:])])
        for m in re.finditer(b"\x01{%d,}" % ((TAIL_LOOP_REPEATS - 1) * p), eq):
            i, j = m.start(), m.end()
            if _primitive_period(s[i:i + p]) == p:
                out.append({"start": i, "end": j + p, "unit": text[i:i + p],
                            "period": p, "repeats": (j - i + p) / p})
    return out


def _display_unit(unit: str) -> str:
    """Rotate a loop unit so it starts at a word boundary ('o hell' -> 'hello')."""
    for k in range(1, len(unit)):
        if unit[k - 1].isspace() and not unit[k].isspace():
            return (unit[k:] + unit[:k]).strip()[:60]
    return unit.strip()[:60]


def _loop_reasons(text: str, stopped_at_length: bool | None) -> list[str]:
    body = text[-LOOP_ANALYSE_CHARS:]
    stripped_len = len(body.rstrip())
    loops = [lp for lp in find_loops(body)
             if sum(1 for c in lp["unit"] if c.isalpha()) >= LOOP_MIN_UNIT_LETTERS]

    def span(lp):
        return lp["end"] - lp["start"]

    reasons = []
    loud = [lp for lp in loops if lp["repeats"] >= LOOP_MANY_REPEATS
            or (lp["repeats"] >= LOOP_REPEATS and span(lp) >= LOOP_MIN_SPAN)]
    if loud:
        best = max(loud, key=span)
        reasons.append("phrase_loop: %r x %.1f over %d chars" % (
            _display_unit(best["unit"]), best["repeats"], span(best)))
    # A loop reaching the end of the text (allowing a partial last repeat); find_loops only
    # returns loops of at least TAIL_LOOP_REPEATS repeats.
    tail = [lp for lp in loops if lp["end"] + lp["period"] >= stripped_len]
    if tail:
        best = max(tail, key=span)
        detail = "%r x %.1f" % (_display_unit(best["unit"]), best["repeats"])
        if stopped_at_length and span(best) >= TAIL_LOOP_MIN_SPAN:
            reasons.append("length_in_loop: stopped at max_tokens inside " + detail)
        elif stopped_at_length is None and span(best) >= TAIL_LOOP_NOLEN_MIN_SPAN \
                and span(best) >= TAIL_LOOP_NOLEN_FRACTION * max(1, stripped_len):
            reasons.append("tail_loop: " + detail)
    return reasons


def _leak_reasons(view: str, prompt: "_Prompt") -> list[str]:
    # prompt.mentioned holds each marker also without its "/" (</s> -> <s>).
    mentioned = prompt.mentioned
    reasons = []
    stripped = view.rstrip()
    # An end-of-sequence marker at the very end is harmless.
    leaks = [m.group(0) for m in _SPECIAL_TOKEN_RE.finditer(stripped)
             if not (m.group(0) in _TRAILING_EOS and m.end() == len(stripped))
             and m.group(0).replace("/", "") not in mentioned]
    if leaks:
        reasons.append("special_token: %s x %d" % (leaks[0], len(leaks)))
    byte_toks = [t for t in _BYTE_TOKEN_RE.findall(view) if t not in mentioned]
    if byte_toks:
        reasons.append("byte_token: %s x %d" % (byte_toks[0], len(byte_toks)))
    bpe = _BPE_MARKER_RE.findall(view)
    if len(bpe) >= BPE_MARKER_MIN and not any(c in mentioned for c in "\u0120\u010a"):
        reasons.append("bpe_marker: %s x %d" % (_show(bpe[0][0]), len(bpe)))
    sp = _SP_MARKER_RE.findall(view) + _SP_SPACE_RE.findall(view)
    if len(sp) >= SP_MARKER_MIN and "\u2581" not in mentioned:
        reasons.append("sentencepiece_marker: U+2581 x %d" % len(sp))
    tags = [t for t in _ROLE_TAG_RE.findall(view) if t.replace("/", "") not in mentioned]
    if tags:
        reasons.append("special_token: %s x %d" % (tags[0], len(tags)))
    if _BOS_RUN_RE.search(view) or (view.count("<s>") != view.count("</s>")
                                    and "<s>" not in mentioned):
        reasons.append("special_token: <s> x %d" % (view.count("<s>") + view.count("</s>")))
    hdr = _HEADER_LEAK_RE.findall(view)
    if hdr:
        reasons.append("special_token: role header text %r x %d" % (hdr[0].strip(), len(hdr)))
    return reasons


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
    tokens = prose.split()
    words = [w for w in map(_norm_word, tokens) if any(c.isalpha() for c in w)]
    if not words:
        return reasons
    distinct = len(set(words))
    guiraud = distinct / math.sqrt(len(words))
    if len(words) >= LOW_WORD_DIVERSITY_MIN_WORDS and guiraud < LOW_WORD_DIVERSITY_MAX_R:
        reasons.append("low_word_diversity: %d distinct in %d words (R=%.2f)" % (
            distinct, len(words), guiraud))
    elif len(words) >= SALAD_MIN_WORDS and guiraud <= SALAD_MAX_R:
        stray = sum(1 for line in prose.splitlines() for x in line.split()[1:]
                    if _STRAY_PUNCT_RE.match(x))
        if stray / len(tokens) >= SALAD_STRAY_PUNCT_RATIO:
            reasons.append("word_salad: %d distinct in %d words (R=%.2f), %d stray "
                           "punctuation tokens" % (distinct, len(words), guiraud, stray))
    return reasons


# --- scripts -----------------------------------------------------------------
# (first code point, last code point, script group).  Han and Kana are one group
# ("cj"): Japanese mixes them, Chinese is Han alone.
_SCRIPT_RANGES = (
    (0x0041, 0x005A, "latin"), (0x0061, 0x007A, "latin"), (0x00C0, 0x024F, "latin"),
    (0x1E00, 0x1EFF, "latin"), (0x0370, 0x03FF, "greek"), (0x0400, 0x052F, "cyrillic"),
    (0x0530, 0x058F, "armenian"), (0x0590, 0x05FF, "hebrew"), (0x0600, 0x06FF, "arabic"),
    (0x0750, 0x077F, "arabic"), (0x0900, 0x097F, "devanagari"), (0x0980, 0x09FF, "bengali"),
    (0x0A80, 0x0AFF, "gujarati"), (0x0D80, 0x0DFF, "sinhala"), (0x0E00, 0x0E7F, "thai"),
    (0x1000, 0x109F, "myanmar"), (0x10A0, 0x10FF, "georgian"), (0x1100, 0x11FF, "hangul"),
    (0x3040, 0x30FF, "cj"), (0x3130, 0x318F, "hangul"), (0x31F0, 0x31FF, "cj"),
    (0x3400, 0x4DBF, "cj"), (0x4E00, 0x9FFF, "cj"), (0xAC00, 0xD7AF, "hangul"),
    (0xF900, 0xFAFF, "cj"), (0xFF66, 0xFF9F, "cj"), (0x20000, 0x2FFFF, "cj"),
)


def _script(ch: str):
    """A letter's script group ("other" outside _SCRIPT_RANGES); None for anything else."""
    o = ord(ch)
    if o < 0x41 or not ch.isalpha():
        return None
    return next((name for lo, hi, name in _SCRIPT_RANGES if lo <= o <= hi), "other")


# A Han, Kana or Hangul character carries about as much as three Latin letters.
_WIDE_WEIGHT = {"cj": 3, "hangul": 3}


def _script_counts(text: str) -> dict:
    """Letters per script, CJK weighted (see _WIDE_WEIGHT)."""
    counts: dict = {}
    for s in filter(None, map(_script, text)):
        counts[s] = counts.get(s, 0) + _WIDE_WEIGHT.get(s, 1)
    return counts


def _dominant(counts: dict):
    return max(counts, key=counts.get) if counts else None


# Language names (in English and in the language itself) -> script group.
_LANGUAGE_NAMES = (
    ("latin", r"english|german|french|spanish|italian|portuguese|dutch|polish|swedish|"
              r"turkish|vietnamese|indonesian|czech|romanian|latin|englisch|deutsch|"
              r"fran[cç]ais|espa[nñ]ol|italiano|anglais|ingl[eé]s|allemand|alem[aá]n|"
              r"englische|deutsche|英文|英语|英語|德语|法语|西班牙语|영어|английск"),
    ("cj", r"chinese|japanese|mandarin|cantonese|中文|汉语|漢語|简体|繁體|繁体|日语|日本語|"
           r"日文|chinois|japonais|chino|japon[eé]s|chinesisch|japanisch|китайск|японск|중국어|일본어"),
    ("hangul", r"korean|한국어|韩语|韓国語|coréen|koreanisch|корейск"),
    ("cyrillic", r"russian|ukrainian|bulgarian|serbian|русск|russe|ruso|russisch|俄语|러시아어"),
    ("arabic", r"arabic|persian|farsi|urdu|عربي|arabe|árabe|arabisch|阿拉伯语"),
    ("devanagari", r"hindi|marathi|nepali|sanskrit|हिन्दी|हिंदी"),
    ("greek", r"greek|ελληνικ"), ("hebrew", r"hebrew|עברית"), ("thai", r"\bthai\b|ไทย"),
)
_LANGUAGE_NAME_RES = tuple(
    (g, re.compile(r"(?:\b(?:in|into|to|using|auf|en|na|ins|на)\s+(?:\w+\s+)?(?:%s)"
                   r"|(?:用|使用|以|翻译成|译成|翻譯成)\s*(?:%s)|(?:%s)\w*\s+only)" % (p, p, p), re.I))
    for g, p in _LANGUAGE_NAMES)
_TRANSLATE_RE = re.compile(
    r"translat|übersetz|traduc|tradu[iz]|перев[оеё]д|翻[译譯]|[訳译]|번역|ترجم|अनुवाद|"
    r"\bin (?:\w+ )?(?:and \w+ )?(?:language|languages)\b|multilingual|languages",
    re.I)

# --- prompt analysis -----------------------------------------------------------
_REPEAT_RE = re.compile(
    r"\brepeat|\brecite|\b(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|"
    r"twelve|fifteen|twenty|thirty|forty|fifty|hundred)\s+times\b|\btwice\b|\bthrice\b|"
    r"\b\d+\s*[x×]\b|\bover and over|\b\d+\s+(?:\S+\s+){0,2}(?:characters|chars|copies|"
    r"lines|letters)\b|重复|[\d一二三四五六七八九十两]+\s*[遍次回]|번|\bраз|\bfois\b|\bveces\b|\bmal\b|"
    r"\bcount(?:ing)? (?:from|down|up|to)\b",
    re.I)
_SONG_RE = re.compile(r"\b(?:song|lyric|lyrics|chorus|refrain|chant|jingle|anthem|rhyme|"
                      r"theme)\b|歌|노래|песн|chanson|canci[oó]n|lied\b", re.I)
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                 "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15,
                 "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "hundred": 100,
                 "twice": 2, "thrice": 3, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5,
                 "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_COUNT_RE = re.compile(r"(\d+|" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))
                       + r")", re.I)


class _Prompt(object):
    """What the prompt asks for, as far as the judgement needs it."""

    def __init__(self, prompt):
        if isinstance(prompt, (list, tuple)):  # chat messages: their contents
            parts = [(m.get("content") or "") if isinstance(m, dict) else m for m in prompt]
            prompt = "\n".join(str(p) for p in parts)
        text = prompt if isinstance(prompt, str) else ("" if prompt is None else str(prompt))
        self.text = text
        self.lower = text.lower()
        self.tokens = set(t.lower() for t in _TOKEN_SEQ_RE.findall(text))
        self.asks_repeat = bool(_REPEAT_RE.search(text))
        self.asks_song = bool(_SONG_RE.search(text))
        self.max_count = max([int(c) if c.isdigit() else _NUMBER_WORDS.get(c.lower(), 0)
                              for c in _COUNT_RE.findall(text)], default=0)
        self.asks_translation = bool(_TRANSLATE_RE.search(text))
        self.requested = set(g for g, rx in _LANGUAGE_NAME_RES if rx.search(text))
        self.scripts = _script_counts(_MARKER_ANY_RE.sub(" ", text))
        self.group = _dominant(self.scripts)
        self.mentioned = _mentioned_markers(text)

    def allows_repetition(self, unit: str, repeats: float) -> bool:
        """Repetition of ``unit`` (about ``repeats`` times) that the prompt asks for."""
        if self.asks_song and repeats <= 40:
            return True
        if not self.asks_repeat:
            return False
        limit = max(3, self.max_count) * 1.5 + 2 if self.max_count else 64
        if repeats > limit:
            return False
        if _TOKEN_SEQ_RE.search(unit) and any(c.isalpha() for c in unit):
            return self.covers(unit) or _is_count_text(unit)
        chars = set(c for c in unit if not c.isspace())
        return bool(chars) and all(c in self.text for c in chars) or _is_count_text(unit)

    def covers(self, text: str, share: float = 0.8) -> bool:
        """Most of the text's words (CJK: characters) come from the prompt."""
        toks = [t.lower() for t in _TOKEN_SEQ_RE.findall(text) if not t.isdigit()]
        if not toks or not self.tokens:
            return False
        return sum(1 for t in toks if t in self.tokens) >= share * len(toks)


def _is_count_text(unit: str) -> bool:
    return bool(unit.strip()) and not any(c.isalpha() for c in unit if c not in "xX")


# --- markers talked about, not leaked --------------------------------------------
def _mentioned_markers(prompt: str) -> set:
    """Markers the prompt talks about (not ones at a chat-template position)."""
    out = set()
    for m in _MARKER_ANY_RE.finditer(prompt):
        before = prompt[:m.start()].rsplit("\n", 1)[-1]
        after = prompt[m.end():].split("\n", 1)[0]
        if not before.strip() or not after.strip():
            continue  # start or end of a line / of the prompt: a template position
        if before[-1:].isspace() or before[-1:] in "`'\"(":
            out.update((m.group(0), m.group(0).replace("/", "")))
    out.update(ch for ch in "\u0120\u010a\u2581" if re.search(r"[`'\"\s]%s[`'\"\s]" % ch, prompt))
    return out


_FENCE_RE = re.compile(r"```.*?(?:```|\Z)", re.S)
_INLINE_CODE_RE = re.compile(r"`[^`\n]{1,200}`")
_QUOTED_RE = re.compile(r"(?<![:\w])\"[^\"\n]{1,120}\"|\u201c[^\u201d\n]{1,120}\u201d"
                        r"|\u00ab[^\u00bb\n]{1,120}\u00bb"
                        r"|(?<![\w:])'[^'\n]{1,60}'(?!\w)")


# --- mojibake ------------------------------------------------------------------
# GPT-2's byte-level alphabet: printable bytes stand for themselves, the others (in order)
# for U+0100 onwards.
_GPT2_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
_GPT2_CHAR_TO_BYTE = {chr(b): b for b in _GPT2_PRINTABLE}
_GPT2_CHAR_TO_BYTE.update((chr(0x100 + k), b) for k, b in enumerate(
    b for b in range(256) if b not in _GPT2_PRINTABLE))
# A UTF-8 lead byte then continuation bytes, as seen through a single-byte code page.
_LEAD_CONT_RE = re.compile(b"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}"
                           b"|[\xf0-\xf4][\x80-\xbf]{3}")
_MOJI_CANDIDATE_RE = re.compile("[\u00a0-\u024f\u0370-\u03ff\u2010-\u203a\u20ac\u2122"
                                "\u2500-\u25a0\u0100-\u0143\u0152\u0153\u0160\u0161\u0178"
                                "\u017d\u017e\u0192\u02c6\u02dc]{2,}")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[\?\d{1,4}[hl]")


def _redecode_count(run: str):
    """How many characters of ``run`` decode as UTF-8 once re-encoded (and how)."""
    best = (0, "")
    for codec in ("cp1252", "latin-1", "cp437", "gpt2"):
        if codec == "gpt2" and not any("\u0100" <= c <= "\u0143" for c in run):
            continue
        try:
            if codec == "gpt2":
                raw = bytes(_GPT2_CHAR_TO_BYTE[c] for c in run)
            else:
                raw = run.encode(codec)
        except (KeyError, UnicodeEncodeError):
            continue
        hits = sum(1 for m in _LEAD_CONT_RE.finditer(raw) if _decodes(m.group(0)))
        if hits > best[0]:
            best = (hits, codec)
    return best


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


_ENCODING_TALK_RE = re.compile(r"mojibake|garbled|encod|decod|latin-?1|cp1252|windows-1252|"
                               r"utf-?8|乱码|文字化け", re.I)


def _mojibake_reasons(view: str, prompt: "_Prompt") -> list:
    if _ENCODING_TALK_RE.search(view):
        return []  # the answer talks about encodings; what it shows is an example
    reasons = []
    hits, how, sample = 0, "", ""
    for m in _MOJI_CANDIDATE_RE.finditer(view):
        if m.group(0) in prompt.text:
            continue
        n, codec = _redecode_count(m.group(0))
        if n:
            hits += n
            how = how or codec
            sample = sample or m.group(0)[:12]
    if hits:
        code = "bpe_bytes" if how == "gpt2" else "mojibake"
        reasons.append("%s: %r re-decodes as UTF-8 (%s) x %d" % (code, sample, how, hits))
    elif _lib("ftfy.badness") is not None:
        try:
            bad = _lib("ftfy.badness").badness(view)
        except Exception:  # pragma: no cover - library trouble must not break the judge
            bad = 0
        if bad >= 2:
            reasons.append("mojibake: ftfy badness %d" % bad)
    ansi = _ANSI_RE.findall(view)
    if len(ansi) >= 2 and not any(a in prompt.text for a in ansi):
        reasons.append("terminal_control: %r x %d" % (ansi[0], len(ansi)))
    return reasons


# --- language switches ---------------------------------------------------------
_FOREIGN_MIN_LETTERS = 4
_PROSE_MIN_LETTERS = 6


# Languages the Latin-script check judges (short texts in rarer ones are too easy to misread),
# with their names in a few languages (a prompt naming the answer's language asked for it).
_LANGUAGE_WORDS = {
    "en": r"english|anglais|ingl[eé]s|englisch|inglese|engels|英文|英语|英語|영어",
    "de": r"german|deutsch|allemand|alem[aá]n|tedesco|duits|德语|ドイツ語|독일어",
    "fr": r"french|fran[cç]ais|franc[eé]s|franz[oö]sisch|francese|frans|法语|フランス語|프랑스어",
    "es": r"spanish|espa[nñ]ol|espagnol|spanisch|spagnolo|spaans|西班牙语|スペイン語|스페인어",
    "it": r"italian|italiano|italien|italienisch|italiaans|意大利语|イタリア語",
    "pt": r"portuguese|portugu[eê]s|portugais|portugiesisch|portoghese|葡萄牙语|ポルトガル語",
    "nl": r"dutch|nederlands|n[eé]erlandais|niederl[aä]ndisch|olandese|荷兰语|オランダ語",
}


def _latin_language(text: str, min_words: int):
    """The language of a Latin-script text, or None when unsure."""
    words = [w.lower() for w in _WORD_RE.findall(text) if _script(w[0]) == "latin"]
    if len(words) < min_words:
        return None
    cld2 = _lib("pycld2")
    if cld2 is not None:
        try:
            reliable, _, details = cld2.detect(text)
        except Exception:  # bad UTF-8 and the like: fall back to the rules
            reliable, details = False, None
        if details is not None:
            name = details[0][1].split("-")[0]
            if not reliable or name == "un":
                return None
            if name not in _STOPWORD_SETS or _stopword_language(words) in (None, name):
                return name
            return None  # the function words disagree: too unsure to call a switch
    return _stopword_language(words)


def _stopword_language(words: list):
    hits = sorted(((sum(1 for w in words if w in sw), lang)
                   for lang, sw in _STOPWORD_SETS.items()), reverse=True)
    (best, lang), (second, _) = hits[0], hits[1]
    if best >= 2 and best >= 0.2 * len(words) and best >= 2 * second:
        return lang
    return None


def _language_reasons(view: str, prompt: "_Prompt") -> list:
    prose = "\n".join(_prose_lines(view))
    counts = _script_counts(prose)
    total = sum(counts.values())
    all_counts = _script_counts(view)
    if sum(all_counts.values()) < 2:
        return []
    reasons = []
    dom = _dominant(counts)
    # 1. The answer's language is not the prompt's and was not asked for.
    pg = prompt.group
    if dom and pg and sum(prompt.scripts.values()) >= 2 and total >= _PROSE_MIN_LETTERS \
            and counts.get(pg, 0) < 0.2 * total:
        allowed = {pg} | prompt.requested
        if prompt.requested and "only" in prompt.lower:
            allowed = set(prompt.requested)
        free = prompt.asks_translation and not prompt.requested
        if dom not in allowed and not free:
            reasons.append("language_switch: %s answer to a %s prompt" % (dom, pg))
        elif prompt.requested and dom not in prompt.requested and not free \
                and pg in prompt.requested:
            reasons.append("language_switch: %s answer, %s requested" % (
                dom, "/".join(sorted(prompt.requested))))
    # 1b. Both in Latin script: which language (pycld2 on the controller, function words
    # on the host).
    if dom == "latin" and pg == "latin" and not prompt.asks_translation:
        pl = _latin_language(prompt.text, 3)
        al = _latin_language(prose, 6)
        if pl and al and pl != al and pl in _LANGUAGE_WORDS and al in _LANGUAGE_WORDS \
                and not re.search(_LANGUAGE_WORDS[al], prompt.lower):
            reasons.append("language_switch: %s answer to a %s prompt (%s)" % (
                al, pl, "pycld2" if _lib("pycld2") is not None else "function words"))
    # 2. Foreign-script runs inside the text (Latin is everyone's technical script); a run is
    # one script's letters and the spaces and punctuation between them.
    dom = _dominant(all_counts)
    foreign = []
    letters = [(i, s) for i, s in enumerate(map(_script, view)) if s is not None]
    for s, run in groupby(letters, key=lambda pos: pos[1]):
        if s in (dom, "latin") or s in prompt.scripts or s in prompt.requested:
            continue
        run = list(run)
        chunk = view[run[0][0]:run[-1][0] + 1]
        if dom == "hangul" and s == "cj" and not any("\u3040" <= c <= "\u30ff" for c in chunk):
            continue  # Hanja in Korean (Kana in Korean is foreign)
        foreign.append((s, chunk, len(run)))
    nletters = sum(n for _, _, n in foreign)
    if not prompt.asks_translation and nletters >= _FOREIGN_MIN_LETTERS \
            and (max(n for _, _, n in foreign) >= 2 or len(foreign) >= 3):
        reasons.append("language_switch: %d %s letters inside %s text (%r)" % (
            nletters, foreign[0][0], dom, foreign[0][1][:20]))
    return reasons


# --- word salad ------------------------------------------------------------------
_WORD_RE = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)?")
_STOPWORDS = {
    "en": "the of and to a in is it that for on with as was are be this by at or from an not "
          "but have has i you he she we they my your his her its our their me him them what "
          "which who how when where why can will would could should do does did if so no yes "
          "than then there here all any some one more most also just about into out up over "
          "very only there's it's i'm don't let's let is isn't were been being after before "
          "because while such",
    "de": "der die das und ist ich nicht ein eine zu in den mit von sie es im dem des auf für "
          "ist sich auch als an wie wir mein dein sein wird werden bei oder aus nach",
    "fr": "le la les de des du et est un une en que qui pour dans pas sur au aux avec ce il "
          "elle je vous nous ne se son sa ses où mais ou plus à très bien comme tout y",
    "es": "el la los las de del y es un una en que por para con no se su al lo como más pero "
          "sus le ya o este está son tiene a muy",
    "it": "il la di che e è un una per non con del della in sono si da al le lo gli ma",
    "pt": "o a os as de do da e é um uma em que para com não no na por se mais",
    "nl": "de het een en van is in dat op te zijn met voor niet aan er ook als",
}
_STOPWORD_SETS = {k: frozenset(v.split()) for k, v in _STOPWORDS.items()}
_ALL_STOPWORDS = frozenset().union(*_STOPWORD_SETS.values())
_GLUE_PREFIXES = ("and", "the", "of", "to", "is")
SALAD_MIN_TOKENS = 8
SALAD_MAX_FUNCTION_RATIO = 0.12
SALAD_TAIL_WINDOW = 16
JUNK_RATIO = 0.1
JUNK_MIN = 3
UNKNOWN_RATIO = 0.12         # out-of-vocabulary share (wordfreq) that makes English prose salad
VOCAB_MAX_WORDS = 2000       # only the last words are looked up
SCRIPT_SOUP = 4
_LIST_LINE_RE = re.compile(r"^\s*(?:[-*+\u2022]|\d+[.)]|[a-z][.)])\s")
_KV_LINE_RE = re.compile(r"^\s*[\"']?[\w.-]+[\"']?\s*[:=](?!//)")


_CODE_LINE_RE = re.compile(r"^(?:\t| {4,})\S|^\s*(?:def|class|for|if|while|return|import|"
                           r"from|print|var|let|const|function|#include|#define|SELECT|FROM|"
                           r"WHERE)\b.*[(=:\[{]")


def _prose_lines(text: str) -> list:
    """Lines of running text: no table rows, list items, key: value or code-looking lines."""
    out = []
    for line in _FENCE_RE.sub("\n", text).splitlines():
        s = line.strip()
        if not s or "|" in s or _LIST_LINE_RE.match(line) or _KV_LINE_RE.match(line) \
                or _CODE_LINE_RE.match(line) or s.endswith(("{", "}", ";")) \
                or s.endswith((")", ":")) and len(s.split()) <= 3:
            continue
        out.append(_INLINE_CODE_RE.sub(" ", line))
    return out


def _is_junk(tok: str) -> bool:
    core = tok.strip("\"'`.,;:!?()[]{}*")
    if len(core) < 3 or "://" in core or core.startswith("www.") or "/" in core:
        return False
    if re.fullmatch(r"[0-9a-fA-F-]{8,}|[A-Za-z0-9+/=]{20,}", core):
        return False  # hashes, uuids, base64
    if not any(c.isalpha() for c in core):
        return False
    if "_" in core:
        parts = core.split("_")
        if not all(len(p) >= 2 for p in parts) or any(not p.isalnum() for p in parts) \
                or len(set(p.islower() for p in parts if p.isalpha())) > 1:
            return True
    if re.search(r"[a-z]{3}[A-Z]", core) and not re.fullmatch(r"(?:[A-Z]?[a-z]+)+", core):
        return True  # medicineHash, scarMS, TumblrgetDb (not JavaScript-like Camel words)
    if re.search(r"[a-z]{4}\d", core):
        return True  # optimistic429
    if len(re.findall(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])", core)) >= 4:
        return True  # P23D323D4
    if len(core) >= 12 and re.search(r"([^\W\d_]{3,})\W?\1", core):
        return True  # gilliesgillies-illies
    scripts = set(s for s in (_script(c) for c in core) if s)
    if len(scripts) >= 2 and not scripts <= {"latin", "cj"} | ({"latin", "hangul"}):
        return True  # надморскојandis
    if ("<" in core) != (">" in core) or re.search(r"\w\">|\">\w", core):
        return True  # <start_turn, turn">
    return False


BRACKET_MISMATCH_MIN = 2
_CLOSER = {")": "(", "]": "[", "}": "{"}


def _bracket_mismatches(text: str) -> int:
    """Closing brackets of the wrong kind for the innermost open one ('(a]', '(b}')."""
    stack = []
    bad = 0
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in _CLOSER:
            if stack and stack[-1] == _CLOSER[ch]:
                stack.pop()
            elif stack:
                bad += 1
                if _CLOSER[ch] in stack:
                    while stack[-1] != _CLOSER[ch]:
                        stack.pop()
                    stack.pop()
    return bad


def _function_ratio(words: list) -> float:
    """The largest share of one language's function words."""
    return max(sum(1 for w in words if w in sw) / len(words) for sw in _STOPWORD_SETS.values())


def _salad_reasons(text: str, view: str, prompt: "_Prompt") -> list:
    reasons = []
    # Code-looking garbage: closing brackets that do not match the open ones.
    mism = _bracket_mismatches(_QUOTED_RE.sub(" ", _INLINE_CODE_RE.sub(" ", text)))
    if mism >= BRACKET_MISMATCH_MIN:
        reasons.append("word_salad: %d mismatched brackets" % mism)
    prose = "\n".join(_prose_lines(view))
    toks = prose.split()
    if not toks:
        return reasons
    cores = (t.strip("\"'`.,;:!?()[]{}*\u201c\u201d\u2018\u2019\u00ab\u00bb-") for t in toks)
    latin_words = [c.lower() for c in cores
                   if c.isalpha() and all(_script(ch) == "latin" for ch in c)]
    counts = _script_counts(prose)
    latin_share = counts.get("latin", 0) / float(max(1, sum(counts.values())))
    # Function words: running text in any language has them; salad does not.
    enumeration = sum(1 for t in toks if t.endswith((",", ";"))) >= 0.4 * len(toks)
    if len(latin_words) >= SALAD_MIN_TOKENS and latin_share >= 0.6 and not enumeration:
        ratio = _function_ratio(latin_words)
        if ratio < SALAD_MAX_FUNCTION_RATIO:
            reasons.append("word_salad: %d words, %.0f%% function words" % (
                len(latin_words), 100 * ratio))
        elif len(latin_words) >= 2 * SALAD_TAIL_WINDOW:
            tail = latin_words[-SALAD_TAIL_WINDOW:]
            r2 = _function_ratio(tail)
            if r2 < 0.07:
                reasons.append("word_salad: last %d words, %.0f%% function words" % (
                    len(tail), 100 * r2))
    # Junk tokens: glued fragments, stray markup, letters-and-digit soup.
    junk = [t for t in toks if _is_junk(t)]
    nj = len(junk)
    if (nj >= JUNK_MIN and nj >= JUNK_RATIO * len(toks)) \
            or (len(toks) < 20 and nj >= 2 and nj >= 0.2 * len(toks)) \
            or (nj and sum(len(j) for j in junk) >= 0.4 * len("".join(toks))
                and len("".join(toks)) >= 40):
        reasons.append("word_salad: %d junk tokens in %d (%r)" % (nj, len(toks), junk[0][:30]))
    # A function word glued to a word the text also uses alone ("andrequest").
    alone = set(latin_words)
    glued = [w for w in alone if any(
        w.startswith(p) and len(w) - len(p) >= 5 and w[len(p):] in alone
        for p in _GLUE_PREFIXES)]
    if len(glued) >= 2:
        reasons.append("word_salad: glued words %s" % ", ".join(sorted(glued)[:3]))
    # Many writing systems at once.
    scripts = [s for s in counts if s != "other"]
    if len(scripts) >= SCRIPT_SOUP and not prompt.asks_translation and not prompt.requested:
        reasons.append("word_salad: %d scripts (%s)" % (len(scripts), ", ".join(sorted(scripts))))
    # Library judge: out-of-vocabulary words in English-looking prose (15 % English
    # function words).
    if len(latin_words) >= 20 and _lib("wordfreq") is not None \
            and sum(1 for w in latin_words if w in _STOPWORD_SETS["en"]) \
            >= 0.15 * len(latin_words):
        checked = latin_words[-VOCAB_MAX_WORDS:]
        unknown = [w for w in checked if len(w) > 2 and _zipf(w) < 1.0]
        if len(unknown) >= UNKNOWN_RATIO * len(checked) and len(unknown) >= 4:
            reasons.append("word_salad: %d of %d words not English (wordfreq: %s)" % (
                len(unknown), len(checked), ", ".join(unknown[:3])))
    return reasons


def _zipf(word: str) -> float:
    try:
        return _lib("wordfreq").zipf_frequency(word, "en")
    except Exception:  # pragma: no cover
        return 8.0


# --- loops the character-level finder misses -----------------------------------
_TOKEN_SEQ_RE = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]|"
                           r"[^\W\d_\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]+|\d+")
TRIGRAM_WINDOW = 48
TRIGRAM_MIN_TOKENS = 12
TRIGRAM_MAX_DISTINCT = 0.6
TRIGRAM_MAX_DISTINCT_STOP = 0.5
BIGRAM_REPEAT_MIN = 6
BIGRAM_REPEAT_SHARE = 0.12
_DIGITS_RE = re.compile(r"\d+")
_EMPTY_SLOT_RE = re.compile(r"[^\W\d_]:\s*[.,;]")
_EMPTY_NUMBERED_RE = re.compile(r"(?:^|\s)\d+\.(?=\s+\d+\.)")


def _repetition_reasons(text: str, prompt: "_Prompt", finish: str) -> list:
    reasons = []
    prose = "\n".join(_prose_lines(text))
    toks = [t.lower() for t in _TOKEN_SEQ_RE.findall(prose) if not t.isdigit()]
    tail = toks[-TRIGRAM_WINDOW:]
    if len(tail) >= TRIGRAM_MIN_TOKENS:
        tri = list(zip(tail, tail[1:], tail[2:]))
        distinct = len(set(tri)) / float(len(tri))
        limit = TRIGRAM_MAX_DISTINCT_STOP if finish == "stop" else TRIGRAM_MAX_DISTINCT
        if finish == "stop" and len(tail) < 24:
            limit = 0.0
        if distinct < limit and not prompt.allows_repetition(" ".join(tail), 3):
            reasons.append("repetitive_tail: %.0f%% distinct trigrams in the last %d tokens"
                           % (100 * distinct, len(tail)))
    words = [t for t in toks if t.isalpha()]
    big = Counter((a, b) for a, b in zip(words, words[1:])
                  if a != b and not (a in _ALL_STOPWORDS and b in _ALL_STOPWORDS))
    if big:
        (a, b), n = big.most_common(1)[0]
        if n >= BIGRAM_REPEAT_MIN and n >= BIGRAM_REPEAT_SHARE * (len(words) - 1) \
                and not prompt.allows_repetition(a + " " + b, n):
            reasons.append("phrase_loop: %r x %d (%.0f%% of word pairs)" % (
                a + " " + b, n, 100.0 * n / (len(words) - 1)))
    # Templated loop: the same line or clause with only its numbers changing.
    norm = _DIGITS_RE.sub("#", text)
    if norm != text:
        for lp in find_loops(norm[-LOOP_ANALYSE_CHARS:]):
            if len(_WORD_RE.findall(lp["unit"])) >= 4 \
                    and not prompt.allows_repetition(lp["unit"], lp["repeats"]):
                reasons.append("templated_loop: %r x %.1f" % (
                    _display_unit(lp["unit"]), lp["repeats"]))
                break
    slots = _EMPTY_SLOT_RE.findall(text)
    if len(slots) >= 3:
        reasons.append("empty_slots: %d template fields left empty" % len(slots))
    if len(_EMPTY_NUMBERED_RE.findall(text)) >= 5 and not prompt.asks_repeat:
        reasons.append("empty_list: numbered items with nothing in them")
    # Word stutter: "white,white,," "rocks,rocks".
    stutter = re.findall(r"\b([^\W\d_]{2,}),\1\b", prose, re.I)
    if len(stutter) >= 2 or (stutter and ",," in prose):
        reasons.append("stutter: %r repeated across a comma x %d" % (stutter[0], len(stutter)))
    # The same answer twice: a long block repeated (nearly) back to back.
    blocks = [b.strip() for b in re.split(r"\n+", text) if b.strip()]
    for x, y in zip(blocks, blocks[1:]):
        if min(len(x), len(y)) >= 50 and _similar(x, y) >= 0.9 \
                and len(x) + len(y) >= 0.5 * len(text.strip()) \
                and not prompt.allows_repetition(x, 2):
            reasons.append("repeated_answer: a %d-char block said twice" % len(x))
            break
    return reasons


def _similar(a: str, b: str) -> float:
    """Share of character bigrams two strings have in common (fast near-duplicate test)."""
    ga = Counter(a[i:i + 2] for i in range(len(a) - 1))
    gb = Counter(b[i:i + 2] for i in range(len(b) - 1))
    return 2.0 * sum((ga & gb).values()) / max(1, sum(ga.values()) + sum(gb.values()))


_REPETITION_CODES = ("char_run", "only_char", "word_run", "phrase_loop", "tail_loop",
                     "low_word_diversity", "low_char_diversity", "templated_loop",
                     "repetitive_tail", "word_salad")


def _allowed_by_prompt(reason: str, prompt: "_Prompt", text: str) -> bool:
    """A repetition reason for a unit the prompt asked to repeat."""
    code = reason.split(":", 1)[0]
    if code not in _REPETITION_CODES or not prompt.text:
        return False
    m = re.search(r": '(.*)' x ([\d.]+)", reason)
    if m:
        unit = m.group(1).replace("\\n", "\n").replace("\\t", "\t")
        return prompt.allows_repetition(unit, float(m.group(2)))
    return (prompt.asks_repeat or prompt.asks_song) and prompt.covers(text)


# --- cross-prompt check ------------------------------------------------------------
SAME_OUTPUT_MIN_CHARS = 24
SAME_OUTPUT_MIN_WORDS = 4


def same_output_reasons(items) -> list:
    """Flag one non-trivial output given for different prompts.

    ``items``: (name, prompt, output) tuples or dicts with those keys.  Returns
    reasons ``"same_output: <names> gave the same N-char answer to M different prompts"``.
    Short answers ("4", "Paris.") may legitimately coincide and are ignored.
    """
    groups: dict = {}
    for item in items or []:
        if isinstance(item, dict):
            name, prompt, output = item.get("name"), item.get("prompt"), item.get("output")
        else:
            name, prompt, output = item
        if not isinstance(output, str):
            continue
        key = " ".join(unicodedata.normalize("NFC", output).split()).lower()
        letters = sum(1 for c in key if c.isalnum())
        wide = sum(1 for c in key if _script(c) in ("cj", "hangul"))
        if letters + 2 * wide < SAME_OUTPUT_MIN_CHARS or (
                len(key.split()) < SAME_OUTPUT_MIN_WORDS and wide < 8):
            continue
        groups.setdefault(key, []).append((str(name), " ".join(str(prompt or "").split())))
    reasons = []
    for key, members in groups.items():
        prompts = set(p for _, p in members)
        if len(prompts) >= 2:
            names = sorted(set(n for n, _ in members))
            reasons.append("same_output: %s gave the same %d-char answer to %d different "
                           "prompts (%r)" % (", ".join(names), len(key), len(prompts), key[:40]))
    return reasons


def expect_matches(text: str, expect: str) -> bool:
    """True when the whole answer (trimmed) matches ``expect``.

    Tolerated around the answer: whitespace, one trailing period, markdown
    emphasis / backticks / quotes wrapping the answer.
    """
    pattern = re.compile(expect, re.DOTALL)
    base = text.strip()
    candidates = [base, base.strip(_EMPHASIS_STRIP)]
    for c in candidates[:2]:
        if c.endswith("."):
            candidates += [c[:-1].rstrip(), c[:-1].strip(_EMPHASIS_STRIP)]
    return any(pattern.fullmatch(c) for c in candidates)


def assess(text, *, prompt=None, expect=None, output_ids=None,
           finish_reason=None, max_tokens=None):
    """Judge one generated answer.  Returns (verdict, reasons).

    ``prompt`` makes the judgement prompt-aware (requested repetition, markers
    the prompt talks about, the prompt's language, requested translations).
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    text = unicodedata.normalize("NFC", text)
    pinfo = _Prompt(unicodedata.normalize("NFC", prompt) if isinstance(prompt, str) else prompt)
    reasons: list[str] = []
    stripped = text.strip()
    stopped_at_length = finish = None
    if finish_reason is not None:
        fr = finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason
        finish = str(fr).lower()
        stopped_at_length = finish == "length"
    if max_tokens and output_ids is not None and len(output_ids) >= int(max_tokens):
        stopped_at_length = True

    if not stripped:
        reasons.append("empty_output: %d chars" % len(text))
    else:
        # What the answer quotes or shows as code is talked about, not leaked.
        view = _QUOTED_RE.sub(" ", _INLINE_CODE_RE.sub(" ", _FENCE_RE.sub(" ", text)))
        if not view.strip():
            view = text
        nfffd = view.count(REPLACEMENT_CHAR)
        if nfffd:
            reasons.append("replacement_char: U+FFFD x %d" % nfffd)
        reasons.extend(_leak_reasons(view, pinfo))
        reasons.extend(_run_reasons(view, "char_run", _char_limit, lambda ch: repr(_show(ch))))
        only_min = ONLY_CHAR_MIN_WIDE if _script(stripped[0]) in ("cj", "hangul") \
            else ONLY_CHAR_MIN
        if (len(stripped) >= only_min and len(set(stripped)) == 1
                and not stripped[0].isdigit()
                and not any(r.startswith("char_run") for r in reasons)):
            reasons.append("only_char: %r x %d" % (_show(stripped[0]), len(stripped)))
        if len(re.sub(r"\s", "", stripped)) >= PUNCT_ONLY_MIN and all(
                unicodedata.category(c).startswith("P") or c.isspace() for c in stripped) \
                and len(set(stripped) - set(" \t\r\n")) > 1:
            reasons.append("punctuation_only: %d chars" % len(stripped))
        words = [_norm_word(w) for w in text.split()]
        reasons.extend(_run_reasons(words, "word_run", _word_limit, lambda w: repr(w[:40])))
        reasons.extend(_loop_reasons(text, stopped_at_length))
        reasons.extend(_diversity_reasons(text))
        reasons.extend(_mojibake_reasons(view, pinfo))
        reasons.extend(_language_reasons(view, pinfo))
        reasons.extend(_salad_reasons(text, view, pinfo))
        reasons.extend(_repetition_reasons(text, pinfo, finish))
        reasons = [r for r in reasons if not _allowed_by_prompt(r, pinfo, text)]
    reasons.extend(_run_reasons(output_ids or [], "token_id_run",
                                lambda v: ID_ZERO_RUN if v == 0 else ID_RUN,
                                lambda v: "id %s" % (v,)))

    wrong: list[str] = []
    if expect:
        try:
            if not expect_matches(text, expect):
                wrong.append("expect_mismatch: %r does not fully match /%s/" % (
                    stripped[:80], expect))
        except re.error as exc:
            wrong.append("bad_expect_regex: %s" % exc)
    if reasons:
        return "degenerate", reasons + wrong
    if wrong:
        return "wrong", wrong
    return "ok", []
