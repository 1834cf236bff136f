# -*- coding: utf-8 -*-
"""Text judgement for generated model output.

``assess(text, ...)`` returns ``(verdict, reasons)`` where verdict is ``'ok'``,
``'degenerate'`` (the text shows a broken decoder) or ``'wrong'`` (well-formed text that
fails a known-answer ``expect`` regex).  Reasons are short machine-readable strings
``"<code>: <detail>"``.  The rules (docs/text-judge.md has one example of each):

- leaks: special tokens and chat-template role tags, byte tokens (<0x0A>), GPT-2 /
  SentencePiece markers, U+FFFD (unless talked about), mojibake (re-decoding, ftfy,
  doubly escaped \\uXXXX), terminal escapes;
- runs and loops: char_run, only_char, punctuation_only, word_run, only_unit,
  word_doubling, phrase_loop / tail_loop / length_in_loop, symbol_loop, templated_loop,
  repetitive_tail, repeated_text (n-gram coverage), repeated_answer, stutter, empty slots
  and lists, whitespace_run, low character / word diversity, token id runs;
- word salad: function-word share, short salad (wordfreq), glued fragments, junk tokens,
  mismatched brackets, script soup;
- language_switch: the answer's script or language is not the prompt's nor requested,
  foreign-script runs inside text (glosses in parentheses excepted), scripts glued inside one
  word, Simplified against Traditional Chinese;
- prompt_echo: the answer is mostly the prompt said back.

The judgement is prompt-aware: repetition the prompt asks for (counts, songs and verses,
DNA repeats, a sentence of one named word), markers the prompt or the answer talks about
(code spans, quotes, an explanation of tokens), the prompt's own language and a requested
translation are not degenerate; code blocks and TeX math are read as code and notation.
``same_output_reasons(items)`` flags one non-trivial answer given to different prompts (a
server that ignores its prompt).

Runs with the standard library alone (on the target host, inside an Ansible module).  Where
``ftfy`` (mojibake), ``pycld2`` (language of a Latin-script prompt and answer) and
``wordfreq`` (out-of-vocabulary words) can be imported - on the controller, from the project
venv - they add their judgement (imported on first use; ``use_libraries(False)`` or
DDTREE_TEXTCHECK_STDLIB_ONLY=1 turns them off); ``judges()`` says which judges are in use.

Thresholds were tuned on the development corpus tests/data/textcheck_corpus.jsonl
(tests/bench/textcheck_corpus.py) and the cases in tests/unit/probe/; the held-out split
tests/data/textcheck_heldout.jsonl is only measured (tests/data/HELDOUT.md).
"""

from __future__ import annotations

import math
import operator
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
LOOP_ANALYSE_CHARS = 8000
SYMBOL_LOOP_REPEATS = 12     # a unit of two or more symbols, no letters or digits ('/ '/ '/)
SYMBOL_LOOP_SPAN = 30   # only the last N characters are scanned for loops

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
    r"\[/?(?:INST\d*|SYS|USER|ASSISTANT|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CALLS|TOOL_RESULT|"
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
        eq = bytes(map(operator.eq, s, s[p:]))
        for m in re.finditer(b"\x01{%d,}" % ((TAIL_LOOP_REPEATS - 1) * p), eq):
            i, j = m.start(), m.end()
            if _primitive_period(s[i:i + p]) == p:
                out.append({"start": i, "end": j + p, "unit": text[i:i + p],
                            "period": p, "repeats": (j - i + p) / p})
    return out


def _rotation_in(unit: str, text: str, first: int = 0) -> bool:
    """Whether ``text`` holds ``unit`` rotated by ``first`` or more characters (a loop unit may
    start anywhere in the repeated text: 'GCA' of 'CAGCAGCAG')."""
    return any((unit[k:] + unit[:k]) in text for k in range(first, len(unit)))


def _display_unit(unit: str) -> str:
    """Rotate a loop unit so it starts at a word boundary ('o hell' -> 'hello')."""
    for k in range(1, len(unit)):
        if unit[k - 1].isspace() and not unit[k].isspace():
            return (unit[k:] + unit[:k]).strip()[:60]
    return unit.strip()[:60]


def _loop_reasons(text: str, stopped_at_length: bool | None) -> list[str]:
    body = text[-LOOP_ANALYSE_CHARS:]
    stripped_len = len(body.rstrip())
    found = find_loops(body)
    loops = [lp for lp in found
             if sum(1 for c in lp["unit"] if c.isalpha()) >= LOOP_MIN_UNIT_LETTERS]

    def span(lp):
        return lp["end"] - lp["start"]

    reasons = []
    sym = [lp for lp in found
           if lp["repeats"] >= SYMBOL_LOOP_REPEATS and lp["end"] - lp["start"] >= SYMBOL_LOOP_SPAN
           and not any(c.isalnum() for c in lp["unit"])
           and not all(c in SEPARATOR_CHARS or c.isspace() for c in lp["unit"])
           and len(set(lp["unit"]) - set(" ")) >= 2]
    if sym:
        best = max(sym, key=lambda lp: lp["end"] - lp["start"])
        reasons.append("symbol_loop: %r x %.1f over %d chars" % (
            _display_unit(best["unit"]), best["repeats"], best["end"] - best["start"]))
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


_TOKEN_TALK_RE = re.compile(r"\b(?:special )?tokens?\b|\btemplate\b|\bstop (?:token|sequence)", re.I)


def _leak_reasons(view: str, prompt: "_Prompt") -> list[str]:
    # prompt.mentioned holds each marker also without its "/" (</s> -> <s>).
    mentioned = prompt.mentioned
    reasons = []
    stripped = view.rstrip()
    # An end-of-sequence marker at the very end is harmless.
    # The prompt asks about a marker and the answer explains tokens / the template: the
    # markers of the same <|...|> family it shows are examples, not leaks.
    talk = bool(mentioned) and bool(_TOKEN_TALK_RE.search(stripped))
    leaks = [m.group(0) for m in _SPECIAL_TOKEN_RE.finditer(stripped)
             if not (m.group(0) in _TRAILING_EOS and m.end() == len(stripped))
             and m.group(0).replace("/", "") not in mentioned
             and not (talk and m.group(0).startswith("<|"))]
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


# Letters that are notation, not writing: phonetic and modifier letters, sub- and superscripts
# (xᵢ, aₙ, Aᶜ), letterlike symbols (ℝ, ℕ) and mathematical alphanumerics.
_NOTATION_RANGES = ((0x1D00, 0x1DBF), (0x2070, 0x209F), (0x2100, 0x214F), (0x1D400, 0x1D7FF))


_SCRIPT_CACHE: dict = {}


def _script(ch: str):
    """A letter's script group ("other" outside _SCRIPT_RANGES); None for anything else
    (non-letters and notation letters, see _NOTATION_RANGES and Unicode category Lm)."""
    try:
        return _SCRIPT_CACHE[ch]
    except KeyError:
        pass
    group = _script_uncached(ch)
    if len(_SCRIPT_CACHE) < 65536:
        _SCRIPT_CACHE[ch] = group
    return group


def _script_uncached(ch: str):
    o = ord(ch)
    if o < 0x41 or not ch.isalpha():
        return None
    name = next((name for lo, hi, name in _SCRIPT_RANGES if lo <= o <= hi), None)
    if name is not None:
        return name
    if any(lo <= o <= hi for lo, hi in _NOTATION_RANGES) or unicodedata.category(ch) == "Lm":
        return None
    return "other"


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
    r"\bcount(?:ing)? (?:from|down|up|to)\b|\b(?:only|entirely|solely) (?:of )?the word\b",
    re.I)
_SONG_RE = re.compile(r"\b(?:song|lyric|lyrics|chorus|refrain|chant|jingle|anthem|rhyme|verse|verses|"
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
        # The most repeats a request allows: the count it names with some slack, else 64.
        self.repeat_limit = max(3, self.max_count) * 1.5 + 2 if self.max_count else 64
        self.asks_translation = bool(_TRANSLATE_RE.search(text))
        self.requested = set(g for g, rx in _LANGUAGE_NAME_RES if rx.search(text))
        self.scripts = _script_counts(_MATH_RE.sub(" ", _MARKER_ANY_RE.sub(" ", text)))
        self.group = _dominant(self.scripts)
        self.mentioned = _mentioned_markers(text)
        self.asks_dna = bool(_DNA_TALK_RE.search(text))
        self.script_variant = _han_variant(text)

    def allows_repetition(self, unit: str, repeats: float) -> bool:
        """Repetition of ``unit`` (about ``repeats`` times) that the prompt asks for."""
        if self.asks_song and repeats <= 40:
            return True
        if self.asks_dna and unit.strip() and repeats <= 200 \
                and all(c in "ACGTU" for c in unit.strip()):
            return True  # a tandem repeat shown for a question about DNA
        if not self.asks_repeat:
            return False
        if repeats > self.repeat_limit:
            return False
        if _TOKEN_SEQ_RE.search(unit) and any(c.isalpha() for c in unit):
            if self.covers(unit) or _is_count_text(unit):
                return True
            # A loop unit starts anywhere in the repeated text: 'GCA' in 'CAGCAGCAG'.
            core = unit.strip().lower()
            return len(core) >= 3 and " " not in core and _rotation_in(core, self.lower, first=1)
        chars = set(c for c in unit if not c.isspace())
        return bool(chars) and all(c in self.text for c in chars) or _is_count_text(unit)

    def covers(self, text: str, share: float = 0.8) -> bool:
        """Most of the text's words (CJK: characters) come from the prompt."""
        toks = [t.lower() for t in _TOKEN_SEQ_RE.findall(text) if not t.isdigit()]
        if not toks or not self.tokens:
            return False
        return sum(1 for t in toks if t in self.tokens) >= share * len(toks)


_DNA_TALK_RE = re.compile(r"\bdna\b|\brna\b|nucleotide|microsatellite|tandem|telomer|codon|"
                          r"\bprimer|\bgenom|\bsequenc|\bbase pairs?\b", re.I)

# Simplified and Traditional Chinese: characters of common words that differ between the two
# (simplified first).  An answer in the other variant than the prompt's is a language switch.
_HAN_PAIRS = ("这這个個们們来來说說为為对對时時会會过過还還后後发發从從进進场場写寫书書长長问問"
              "门門间間东東车車见見观觀现現实實学學听聽话話语語让讓认認识識请請谁誰读讀买買卖賣"
              "开開关關头頭体體点點经經结結给給线線红紅网網页頁题題颜顏风風飞飛马馬鸟鳥鱼魚无無"
              "爱愛变變将將与與应應样樣温溫惊驚渗滲叙敘强強悬懸阳陽义義乐樂华華国國图圖园園员員"
              "边邊达達运運吗嗎欢歡谢謝买買钱錢电電脑腦闻聞产產样樣处處么麼")
_SIMPLIFIED = frozenset(_HAN_PAIRS[0::2]) - frozenset(_HAN_PAIRS[1::2])
_TRADITIONAL = frozenset(_HAN_PAIRS[1::2]) - frozenset(_HAN_PAIRS[0::2])
HAN_VARIANT_MIN = 3


def _han_variant(text: str):
    """(simplified-only, traditional-only) character counts of ``text``."""
    return (sum(1 for c in text if c in _SIMPLIFIED), sum(1 for c in text if c in _TRADITIONAL))


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
# TeX math: $...$, $$...$$, \(...\), \[...\] holding TeX (a backslash, ^, _ or braces).
_MATH_RE = re.compile(r"\$\$[^$]{1,2000}\$\$|\$(?=[^$\n]{0,300}[\\^_{}])[^$\n]{1,300}\$"
                      r"|\\\((?s:.){1,600}?\\\)|\\\[(?s:.){1,2000}?\\\]")
# Doubly escaped text: JSON string values holding a literal backslash-u escape ("\\\\u4e0a"),
# i.e. text escaped twice before it reached the client.
_DOUBLE_ESCAPE_RE = re.compile(r"\\\\+u[0-9a-fA-F]{4}")
DOUBLE_ESCAPE_MIN = 3


def _escape_reasons(text: str, prompt: "_Prompt") -> list:
    n = len(_DOUBLE_ESCAPE_RE.findall(text))
    if n >= DOUBLE_ESCAPE_MIN and "\\u" not in prompt.text and "escap" not in prompt.lower:
        return ["mojibake: %d doubly escaped \\uXXXX sequences (text escaped twice)" % n]
    return []


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
        if s == "greek" and len(run) == 1:
            continue  # a Greek letter on its own is a symbol (\u0394x, \u03c0r\u00b2, \u03b1 = 0.05)
        if view[:run[0][0]].rstrip()[-1:] in _OPEN_GLOSS \
                and _next_visible(view, run[-1][0] + 1) in _CLOSE_GLOSS:
            continue  # a gloss: 'Dim sum (\u70b9\u5fc3)', 'Vanakkam (\u0bb5\u0ba3\u0b95\u0bcd\u0b95\u0bae\u0bcd)'
        foreign.append((s, chunk, len(run)))
    reasons.extend(_glued_script_reasons(view, dom, prompt))
    # 3. Simplified against Traditional Chinese.
    ps, pt = prompt.script_variant
    if ps + pt and not prompt.asks_translation:
        s_, t_ = _han_variant(prose)
        if ps and not pt and t_ >= HAN_VARIANT_MIN and t_ >= 2 * s_:
            reasons.append("language_switch: Traditional Chinese answer (%d characters) to a "
                           "Simplified Chinese prompt" % t_)
        elif pt and not ps and s_ >= HAN_VARIANT_MIN and s_ >= 2 * t_:
            reasons.append("language_switch: Simplified Chinese answer (%d characters) to a "
                           "Traditional Chinese prompt" % s_)
    nletters = sum(n for _, _, n in foreign)
    if not prompt.asks_translation and nletters >= _FOREIGN_MIN_LETTERS \
            and (max(n for _, _, n in foreign) >= 2 or len(foreign) >= 3):
        reasons.append("language_switch: %d %s letters inside %s text (%r)" % (
            nletters, foreign[0][0], dom, foreign[0][1][:20]))
    return reasons


_OPEN_GLOSS = ("(", "\uff08", "[")
_CLOSE_GLOSS = (")", "\uff09", "]", ",", ":")
# Scripts glued inside one word ("1 hour\u7fa4", "\u0aaa ooNT"-style splices).  Latin glued to
# CJK or Hangul is normal when CJK / Hangul is the text's script ("\u7528Python\u5199",
# "API\ub97c"); Greek is notation (\u03bcs); Kana and Han are one group.
_GLUE_OK = {("cj", "latin"), ("hangul", "latin")}


def _next_visible(text: str, i: int) -> str:
    """The first character from ``i`` on that is neither a space nor a combining mark."""
    for ch in text[i:i + 40]:
        if not ch.isspace() and not unicodedata.category(ch).startswith("M"):
            return ch
    return ""


def _glued_script_reasons(view: str, dom, prompt: "_Prompt") -> list:
    if dom is None or prompt.asks_translation:
        return []
    hits = []
    for word in view.split():
        if len(word) < 2 or word.isascii():
            continue
        prev = None
        for ch in word:
            sc = _script(ch)
            if sc is None or sc == "greek" or sc == "other":
                prev = None
                continue
            if prev is not None and sc != prev:
                pair = (prev, sc) if prev == dom else (sc, prev) if sc == dom else None
                if pair is not None and pair not in _GLUE_OK:
                    hits.append(word)
                    break
            prev = sc
    if hits:
        return ["language_switch: %d word(s) glue another script onto %s text (%r)" % (
            len(hits), dom, hits[0][:24])]
    return []


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
    # Languages the salad rule reads but the language-switch rule does not judge.
    "vi": "là của và có được những các cho với trong một không này đã để người như khi từ "
          "thì cũng nhưng ở ra về sẽ đó nào rất vì bạn tôi hoặc đến",
    "id": "yang dan di ini itu dengan untuk tidak dari dalam akan pada juga ke ada adalah "
          "saya anda kami atau",
    "tr": "ve bir bu da de için ile çok ne gibi daha ama olarak en var mı ben sen değil",
    "pl": "się nie to że do jest jak co na ale po tak od za przez dla jego",
    "sv": "och att det som en på är av för med till den har de inte om ett jag",
    "cs": "se na je že to do jako ale pro jsou jeho tak jak by",
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


_NUCLEOTIDES_RE = re.compile(r"(?:[35]['\u2032]?-)?[ACGTUNacgtun]{6,}(?:-[35]['\u2032]?)?")


def _is_junk(tok: str) -> bool:
    core = tok.strip("\"'`.,;:!?()[]{}*")
    if len(core) < 3 or "://" in core or core.startswith("www.") or "/" in core:
        return False
    if _NUCLEOTIDES_RE.fullmatch(core):
        return False  # a DNA / RNA sequence (GATTACA, 5'-ATGCAG-3')
    wide = sum(1 for c in core if _script(c) in ("cj", "hangul"))
    if wide >= 0.3 * len(core):
        return False  # unspaced CJK text: a token is a whole clause
    if re.fullmatch(r"[0-9a-fA-F-]{8,}|[A-Za-z0-9+/=]{20,}", core):
        return False  # hashes, uuids, base64
    if not any(c.isalpha() for c in core):
        return False
    if "_" in core:
        parts = core.split("_")
        if not all(len(p) >= 2 for p in parts) or any(not p.isalnum() for p in parts) \
                or len(set(p.islower() for p in parts if p.isalpha())) > 1:
            return True
    if re.search(r"[a-z]{3}[A-Z]", core) and not re.fullmatch(r"[A-Z]?[a-z]+(?:[A-Z][a-z]+)*", core):
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
        if ratio < SALAD_MAX_FUNCTION_RATIO and not _words_of_its_language(prose, latin_words):
            reasons.append("word_salad: %d words, %.0f%% function words" % (
                len(latin_words), 100 * ratio))
        elif len(latin_words) >= 2 * SALAD_TAIL_WINDOW:
            tail = latin_words[-SALAD_TAIL_WINDOW:]
            r2 = _function_ratio(tail)
            if r2 < 0.07:
                reasons.append("word_salad: last %d words, %.0f%% function words" % (
                    len(tail), 100 * r2))
    if latin_share >= 0.6:
        reasons.extend(_short_salad_reasons(prose, prompt))
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
    else:
        reasons.extend(_fragment_reasons(latin_words))
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


# Fragment soup ("use a useist help ... messageux casem"): distinct words that are two other
# words of the same text glued together.  Prose has a few (into, without, another); token
# soup from a broken decoder has a third or more.
FRAGMENT_MIN_DISTINCT = 15
FRAGMENT_MIN = 5
FRAGMENT_SHARE = 0.25


def _fragment_reasons(words: list) -> list:
    vocab = set(words)
    if len(vocab) < FRAGMENT_MIN_DISTINCT:
        return []
    glued = [w for w in vocab if len(w) >= 5 and any(
        w[:k] in vocab and w[k:] in vocab and max(k, len(w) - k) >= 3
        for k in range(2, len(w) - 1))]
    if len(glued) >= FRAGMENT_MIN and len(glued) >= FRAGMENT_SHARE * len(vocab):
        return ["word_salad: %d of %d distinct words are two others glued (%s)" % (
            len(glued), len(vocab), ", ".join(sorted(glued)[:3]))]
    return []


def _words_of_its_language(prose: str, words: list) -> bool:
    """Latin-script prose in a language whose short function-word list is not trusted alone
    (not one of _LANGUAGE_WORDS; pycld2 names it and wordfreq knows 80 % of its words in
    that language): not salad."""
    if _lib("pycld2") is None or _lib("wordfreq") is None:
        # Host: Vietnamese is told by its own letters (\u01a1 \u01b0 \u0111 \u0103 and the
        # tone-marked vowels U+1EA0-U+1EF9) on a fifth of the words.
        viet = sum(1 for w in words if any(c in "\u01a1\u01b0\u0111\u0103" or
                                           "\u1ea0" <= c <= "\u1ef9" for c in w))
        return viet >= 0.2 * len(words)
    lang = _cld2_language(prose)
    if not lang or lang in _LANGUAGE_WORDS or lang not in _wordfreq_languages():
        return False
    checked = words[-VOCAB_MAX_WORDS:]
    known = sum(1 for w in checked if _zipf(w, lang) >= 1.5)
    return known >= 0.8 * len(checked)


def _zipf(word: str, lang: str = "en") -> float:
    try:
        return _lib("wordfreq").zipf_frequency(word, lang)
    except Exception:  # an unsupported language or library trouble: treat as a word
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
                  if a != b and not (a in _ALL_STOPWORDS and b in _ALL_STOPWORDS)
                  and not (len(a) == 1 and len(b) == 1))
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
    if len(_EMPTY_NUMBERED_RE.findall(_FENCE_RE.sub(" ", text))) >= 5 and not prompt.asks_repeat:
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
                     "repetitive_tail", "word_salad", "word_doubling", "only_unit",
                     "repeated_text")


def _allowed_by_prompt(reason: str, prompt: "_Prompt", text: str) -> bool:
    """A repetition reason for a unit the prompt asked to repeat."""
    code = reason.split(":", 1)[0]
    if code not in _REPETITION_CODES or not prompt.text:
        return False
    if code == "repetitive_tail" and prompt.asks_song:
        return True
    m = re.search(r": '(.*)' x ([\d.]+)", reason)
    if m:
        unit = m.group(1).replace("\\n", "\n").replace("\\t", "\t")
        return prompt.allows_repetition(unit, float(m.group(2)))
    return (prompt.asks_repeat or prompt.asks_song) and prompt.covers(text)



# --- measures that do not depend on the language ---------------------------------
# Whitespace runaway (JSON mode padding, newline padding up to max_tokens): one run of
# whitespace this long, or with this many line breaks.  Indentation and alignment stay
# far below (16-40 spaces, two or three blank lines).
WS_RUN_CHARS = 80
WS_RUN_NEWLINES = 10
_WS_RUN_RE = re.compile(r"\s{%d,}" % WS_RUN_NEWLINES)


def _whitespace_reasons(text: str) -> list:
    best = None
    for m in _WS_RUN_RE.finditer(text):
        run = m.group(0)
        if len(run) >= WS_RUN_CHARS or run.count("\n") >= WS_RUN_NEWLINES:
            if best is None or len(run) > len(best.group(0)):
                best = m
    if best is None:
        return []
    run = best.group(0)
    return ["whitespace_run: %d whitespace chars (%d line breaks) at char %d of %d" % (
        len(run), run.count("\n"), best.start(), len(text))]


# Word doubling ("TheThe answer answer to to"): the share of words that repeat the word
# before them or are one piece said twice.  Running text in any language stays under 5 %.
DOUBLING_MIN_WORDS = 6
DOUBLING_SHARE = 0.3


def _doubling_reasons(text: str) -> list:
    toks = [t.strip(_WORD_STRIP).lower() or t for t in text.split()]
    words = [w for w in toks if any(c.isalpha() for c in w)]
    if len(words) < DOUBLING_MIN_WORDS:
        return []
    hits = []
    for i, w in enumerate(toks):
        if w in INTERJECTIONS or not any(c.isalpha() for c in w):
            continue
        half = len(w) // 2
        if (i and w == toks[i - 1]) or (half >= 3 and len(w) % 2 == 0 and w[:half] * 2 == w):
            hits.append(w)
    if len(hits) >= 3 and len(hits) >= DOUBLING_SHARE * len(words):
        return ["word_doubling: %r x %d; %d of %d words repeat the word before them" % (
            hits[0], len(hits), len(hits), len(words))]
    return []


# The whole answer is one piece said over and over ("HelloHelloHello", "Paris Paris Paris
# Paris"), judged on letters and digits only so separators do not matter.
ONLY_UNIT_REPEATS = 4
ONLY_UNIT_REPEATS_GLUED = 3     # "HelloHelloHello": no separator at all
ONLY_UNIT_MAX_CHARS = 4000


def _only_unit_reasons(stripped: str, prompt: "_Prompt") -> list:
    compact = "".join(c for c in stripped.lower() if c.isalnum())
    if len(compact) < 6 or len(compact) > ONLY_UNIT_MAX_CHARS:
        return []
    p = _primitive_period(compact)
    unit, reps = compact[:p], len(compact) // p
    if p < 2 or not any(c.isalpha() for c in unit) or unit in INTERJECTIONS:
        return []
    if _primitive_period(unit) != p or any(unit == i * (p // len(i)) for i in INTERJECTIONS):
        return []  # 'hahaha', 'lalala'
    if prompt.asks_repeat or prompt.asks_song:
        asked = "".join(c for c in prompt.lower if c.isalnum())
        if reps <= prompt.repeat_limit and _rotation_in(unit, asked):
            return []  # the prompt asks for it
    glued = not any(not c.isalnum() for c in stripped)
    if reps >= ONLY_UNIT_REPEATS or (glued and reps >= ONLY_UNIT_REPEATS_GLUED):
        return ["only_unit: %r x %d is the whole answer" % (unit[:40], reps)]
    return []


# Repeated text: the share of tokens (words; CJK and Thai characters one each) inside an
# n-gram that occurs more than once.  A paragraph said three times covers ~70 %; prose,
# lists with a repeated shape and code comments stay under 20 %.  Songs and requested
# repetition are let through by the prompt.
REPEAT_NGRAM = 8
REPEAT_NGRAM_WIDE = 16
REPEAT_MIN_TOKENS = 60
REPEAT_COVERAGE = 0.5
REPEAT_MAX_TOKENS = 3000


def _coverage_reasons(text: str) -> list:
    prose = "\n".join(_prose_lines(text))
    toks = [t.lower() for t in _TOKEN_SEQ_RE.findall(prose)][-REPEAT_MAX_TOKENS:]
    if len(toks) < REPEAT_MIN_TOKENS:
        return []
    wide = sum(1 for t in toks if len(t) == 1 and _script(t) in ("cj", "hangul"))
    n = REPEAT_NGRAM_WIDE if wide >= 0.5 * len(toks) else REPEAT_NGRAM
    grams = [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]
    counts = Counter(grams)
    covered = bytearray(len(toks))
    for i, g in enumerate(grams):
        if counts[g] >= 2 and any(c.isalpha() for t in g for c in t):
            covered[i:i + n] = b"\x01" * n
    share = sum(covered) / float(len(toks))
    if share < REPEAT_COVERAGE:
        return []
    gram, times = max(((g, k) for g, k in counts.items()
                       if any(c.isalpha() for t in g for c in t)), key=operator.itemgetter(1))
    return ["repeated_text: %r x %d; %.0f%% of %d tokens are in %d-grams said more than once"
            % (" ".join(gram), times, 100 * share, len(toks), n)]


# Morse code: every token dots and dashes (and '/' between words).
_MORSE_TOKEN_RE = re.compile(r"[.\-\u00b7\u2212\u2013\u2022_]{1,8}|/|\|")


def _is_morse(stripped: str, prompt: "_Prompt") -> bool:
    toks = stripped.split()
    if not toks or not all(_MORSE_TOKEN_RE.fullmatch(t) for t in toks):
        return False
    return "morse" in prompt.lower or len(set(toks) - {"/", "|"}) >= 3


# U+FFFD talked about: the answer names it, or the prompt shows or asks about it.
_FFFD_TALK_RE = re.compile(r"U\+FFFD|replacement char|EF BF BD|\\ufffd|&#xFFFD;|&#65533;", re.I)


def _fffd_talked_about(view: str, prompt: "_Prompt") -> bool:
    return bool(_FFFD_TALK_RE.search(view)) or REPLACEMENT_CHAR in prompt.text \
        or bool(_FFFD_TALK_RE.search(prompt.text))


# The prompt said back: the answer is mostly the prompt's own words in the prompt's order
# (a fine-tuned template echoing "instruction: ... input: ...").
ECHO_MIN_PROMPT_TOKENS = 4
ECHO_SHARE = 0.5


def _echo_reasons(text: str, prompt: "_Prompt") -> list:
    if not prompt.text or prompt.asks_repeat:
        return []
    ptoks = [t.lower() for t in _TOKEN_SEQ_RE.findall(prompt.text)]
    if len(ptoks) < ECHO_MIN_PROMPT_TOKENS:
        return []
    atoks = [t.lower() for t in _TOKEN_SEQ_RE.findall(text)]
    if not atoks or len(atoks) > 4 * len(ptoks) + 8:
        return []
    # Is the prompt a subsequence of the answer, starting near its beginning?
    i, first = 0, None
    for k, t in enumerate(atoks):
        if i < len(ptoks) and t == ptoks[i]:
            first = k if first is None else first
            i += 1
    if i == len(ptoks) and first is not None and first <= 3 \
            and len(ptoks) >= ECHO_SHARE * len(atoks):
        return ["prompt_echo: the answer repeats the %d-token prompt (%d of %d tokens)" % (
            len(ptoks), len(ptoks), len(atoks))]
    return []


# Short answers (3-19 words) made of non-words: the function-word rule needs more text, so
# each word is looked up (wordfreq, in English and the languages pycld2 finds; words with
# letters outside ASCII only when pycld2 names a language; host: words with symbols or
# digits inside letters).
SHORT_SALAD_MIN = 3
SHORT_SALAD_MAX = 20
SHORT_SALAD_SHARE = 0.5
_HEXLIKE_RE = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{5,}|[A-Za-z0-9+/=]{20,}")
_INNER_SYMBOL_RE = re.compile(r"[^\W\d_][`@$%^*~|\\<>=+#]+[^\W\d_]|[^\W\d_]\d+[^\W\d_]")


def _short_salad_reasons(prose: str, prompt: "_Prompt") -> list:
    toks = [t.strip("\"'`.,;:!?()[]{}\u201c\u201d\u2018\u2019\u00ab\u00bb-") for t in prose.split()]
    toks = [t for t in toks if t and any(c.isalpha() for c in t)]
    if not SHORT_SALAD_MIN <= len(toks) < SHORT_SALAD_MAX or prompt.asks_translation \
            or prompt.requested:
        return []
    if not all(_script(c) in ("latin", None) for t in toks for c in t):
        return []
    wf = _lib("wordfreq")
    found = [lang for lang in (_cld2_language(prose), _cld2_language(prompt.text)) if lang]
    if any(lang not in _wordfreq_languages() for lang in found):
        return []  # a language wordfreq does not know (Maltese): its words cannot be checked
    langs = ["en"] + [lang for lang in found if lang != "en"]
    odd = []
    for t in toks:
        if "://" in t or "/" in t or "." in t or "_" in t or (t.isupper() and len(t) <= 6) \
                or _HEXLIKE_RE.fullmatch(t):
            continue  # paths, domains, identifiers, acronyms, hashes and uuids
        if _INNER_SYMBOL_RE.search(t):
            odd.append(t)
        elif wf is not None and t.isalpha() and len(t) > 2 and (t.isascii() or found) and max(
                _zipf(t.lower(), lang) for lang in langs) < 1.0:
            odd.append(t)
    if len(odd) >= 2 and len(odd) >= SHORT_SALAD_SHARE * len(toks):
        return ["word_salad: %d of %d words are not words (%s)" % (
            len(odd), len(toks), ", ".join(odd[:3]))]
    return []


_WF_LANGS: list = []


def _wordfreq_languages() -> frozenset:
    """The languages wordfreq has word lists for (empty without wordfreq)."""
    if not _WF_LANGS:
        try:
            _WF_LANGS.append(frozenset(_lib("wordfreq").available_languages()))
        except Exception:  # no wordfreq, or library trouble
            return frozenset()
    return _WF_LANGS[0]


def _cld2_language(text: str):
    """pycld2's reliable language code for ``text`` (None when unsure or without pycld2)."""
    cld2 = _lib("pycld2")
    if cld2 is None or not text:
        return None
    try:
        reliable, _, details = cld2.detect(text)
    except Exception:  # bad UTF-8 and the like
        return None
    name = details[0][1].split("-")[0]
    return name if reliable and name != "un" else None


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
        mview = _MATH_RE.sub(" ", view) if "$" in view or "\\" in view else view
        nfffd = view.count(REPLACEMENT_CHAR)
        if nfffd and not _fffd_talked_about(view, pinfo):
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
                and len(set(stripped) - set(" \t\r\n")) > 1 and not _is_morse(stripped, pinfo):
            reasons.append("punctuation_only: %d chars" % len(stripped))
        words = [_norm_word(w) for w in text.split()]
        reasons.extend(_run_reasons(words, "word_run", _word_limit, lambda w: repr(w[:40])))
        reasons.extend(_loop_reasons(text, stopped_at_length))
        reasons.extend(_diversity_reasons(text))
        reasons.extend(_mojibake_reasons(view, pinfo))
        reasons.extend(_language_reasons(mview, pinfo))
        reasons.extend(_escape_reasons(_FENCE_RE.sub(" ", text), pinfo))
        reasons.extend(_salad_reasons(text, mview, pinfo))
        reasons.extend(_repetition_reasons(text, pinfo, finish))
        reasons.extend(_whitespace_reasons(text))
        reasons.extend(_doubling_reasons(view))
        if not any(r.startswith(("only_char", "char_run")) for r in reasons):
            reasons.extend(_only_unit_reasons(stripped, pinfo))
        reasons.extend(_coverage_reasons(text))
        reasons.extend(_echo_reasons(text, pinfo))
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
