"""The text judge on real outputs: the labelled corpus (tests/data/textcheck_corpus.jsonl),
the prompt-aware rules, the cross-prompt check and the stdlib-only (target host) path.

The small cases below are written for these tests (not taken from the corpus), so the rules
are checked on text they were not tuned on.
"""

import collections
import json
import os
import subprocess
import sys
import time

import pytest

from probe_testlib import COLLECTIONS, REPO

from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck import judge as textcheck
from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck.judge import assess, judges, same_output_reasons

CORPUS = os.path.join(REPO, "tests", "data", "textcheck_corpus.jsonl")

# Degenerate outputs the judge cannot tell from good ones without knowing more than the text
# and its prompt: pure Chinese / Japanese answers with no prompt recorded (the switch was
# against a system instruction the corpus does not hold), and fluent-looking Chinese gibberish
# (needs a Chinese language model).  Listed so a regression elsewhere is not hidden by them.
# Also short or code-shaped salad from the issue #30 collection (a few broken tokens, or
# Latin fragments glued into Chinese) that no rule reads yet.  On the host (no wordfreq /
# pycld2) one more short salad is not caught: its words can only be looked up.
# The 15 held-out misses moved here in round 2 (ids *-3xxx) that no rule reads yet: a stray
# token in code, a turn not ended, fluent Japanese with a wrong kanji, a short-sentence cycle,
# constant answers (need same_output_reasons), Persian letters in Arabic, a Ukrainian word
# in Russian.
MOVED_KNOWN_MISSES = {"deg-vllm-3001", "deg-other-3002", "deg-llamacpp-3001", "deg-other-3004",
                      "deg-other-3006", "deg-other-3007", "deg-other-3009", "deg-other-3011"}
KNOWN_MISSES = {"deg-other-0041", "deg-ollama-0019", "deg-llamacpp-0003",
                "deg-other-2002", "deg-vllm-2001", "deg-vllm-2002",
                "deg-other-2024"} | MOVED_KNOWN_MISSES
HOST_KNOWN_MISSES = KNOWN_MISSES | {"deg-other-2019"}
# Recall floors on the records collected for development (the moved held-out cases are
# measured on their own: MOVED_MIN_CAUGHT of the 15).
MIN_RECALL = 0.95
HOST_MIN_RECALL = 0.94
MOVED_MIN_CAUGHT = 7
# Per kind: the least share of the kind that must be caught.
KIND_RECALL = {
    "byte_marker_leak": 1.0, "mojibake": 1.0, "phrase_loop": 0.95, "special_token_leak": 1.0,
    "token_id0": 1.0, "token_loop": 1.0, "word_salad": 0.75, "language_switch": 0.75,
    "whitespace_loop": 1.0, "prompt_echo": 1.0, "other": 0.0, "constant_answer": 0.0,
}


def _moved(rec):
    return "moved from held-out" in (rec.get("note") or "")


def _load():
    with open(CORPUS, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


RECORDS = _load()


@pytest.fixture
def libraries():
    """Run a test with the library judges on (they are on by default) and restore after."""
    textcheck.use_libraries(True)
    yield
    textcheck.use_libraries(True)


def _judge_corpus():
    out = []
    for rec in RECORDS:
        verdict, reasons = assess(rec["output"], prompt=rec.get("prompt"),
                                  output_ids=rec.get("output_ids"))
        out.append((rec, verdict, reasons))
    return out


_JUDGED = {}


def _judged(stdlib_only):
    """The corpus judged once per mode (and how long that took, first use included)."""
    if stdlib_only not in _JUDGED:
        textcheck.use_libraries(not stdlib_only)
        try:
            t0 = time.monotonic()
            rows = _judge_corpus()
            _JUDGED[stdlib_only] = (rows, time.monotonic() - t0)
        finally:
            textcheck.use_libraries(True)
    return _JUDGED[stdlib_only]


@pytest.mark.parametrize("stdlib_only", [False, True], ids=["controller", "stdlib"])
def test_corpus_recall_and_no_false_alarms(stdlib_only):
    rows = _judged(stdlib_only)[0]
    bad = [r for r in rows if r[0]["label"] == "degenerate"]
    good = [r for r in rows if r[0]["label"] == "good"]
    assert len(bad) + len(good) == len(RECORDS) == 290
    assert sum(1 for r in RECORDS if _moved(r)) == 25
    alarms = [(r[0]["id"], r[2]) for r in good if r[1] != "ok"]
    assert alarms == []
    missed = set(r[0]["id"] for r in bad if r[1] != "degenerate")
    floor, known = (HOST_MIN_RECALL, HOST_KNOWN_MISSES) if stdlib_only else (MIN_RECALL,
                                                                              KNOWN_MISSES)
    own = [r for r in bad if not _moved(r[0])]
    own_missed = set(r[0]["id"] for r in own) & missed
    assert len(own) - len(own_missed) >= floor * len(own), sorted(own_missed)
    moved = [r for r in bad if _moved(r[0])]
    assert len(moved) == 15
    assert sum(1 for r in moved if r[1] == "degenerate") >= MOVED_MIN_CAUGHT
    assert missed <= known, sorted(missed - known)
    per_kind = collections.defaultdict(lambda: [0, 0])
    for rec, verdict, _ in bad:
        per_kind[rec["kind"]][0] += 1
        per_kind[rec["kind"]][1] += verdict == "degenerate"
    for kind, (n, caught) in per_kind.items():
        assert caught >= KIND_RECALL[kind] * n, (kind, caught, n)


def test_corpus_reason_codes_match_the_kind():
    """Each caught record is caught for a reason of its kind (not by accident)."""
    expected = {
        "special_token_leak": ("special_token", "phrase_loop", "word_run"),
        "byte_marker_leak": ("byte_token", "bpe_marker", "bpe_bytes", "sentencepiece_marker"),
        "mojibake": ("replacement_char", "mojibake", "terminal_control"),
        "whitespace_loop": ("whitespace_run",),
        "prompt_echo": ("prompt_echo",),
        "token_id0": ("char_run", "only_char", "special_token", "word_run", "token_id_run"),
    }
    for rec, verdict, reasons in _judged(False)[0]:
        codes = expected.get(rec["kind"])
        if rec["label"] != "degenerate" or not codes or verdict != "degenerate":
            continue
        assert any(r.startswith(codes) for r in reasons), (rec["id"], reasons)


# --- prompt-aware rules, on cases of our own -----------------------------------------------

@pytest.mark.parametrize("prompt,text", [
    ("Say 'yes' six times.", "yes yes yes yes yes yes"),
    ("Repeat the line 'We ship on Friday.' four times.",
     "We ship on Friday.\nWe ship on Friday.\nWe ship on Friday.\nWe ship on Friday."),
    ("Type the letter z 30 times.", "z" * 30),
    ("Give me a row of 50 '#' characters.", "#" * 50),
    ("Write the chorus of a football chant.",
     "Olé olé olé olé olé olé olé olé, we are the champions"),
    ("把“加油”重复六遍。", "加油加油加油加油加油加油"),
])
def test_requested_repetition_is_ok(prompt, text):
    assert assess(text, prompt=prompt) == ("ok", [])


@pytest.mark.parametrize("prompt,text", [
    # The prompt asks for repetition, but not of this, or far more of it than asked.
    ("Repeat 'hi' three times.", "hi " * 60),
    ("Repeat your answer.", "The plan is done. " + "later " * 20),
    # No repetition asked for.
    ("What is a mutex?", "lock lock lock lock lock lock lock"),
    ("Describe the ocean.", "The ocean is vast and blue. " * 5),
])
def test_unrequested_repetition_is_degenerate(prompt, text):
    assert assess(text, prompt=prompt)[0] == "degenerate"


@pytest.mark.parametrize("prompt,text", [
    ("What is <|eot_id|> used for in Llama 3?",
     "<|eot_id|> marks the end of a turn; servers stop generating when they see it."),
    ("Why does my log show <0x0A> everywhere?",
     "<0x0A> is the byte-fallback token for a newline; the detokenizer did not merge it."),
    ("", "Set `skip_special_tokens=False` to keep `<|im_start|>` in the text."),
    ("", 'The tokenizer prints "<unk>" when a character is missing from the vocabulary.'),
    ("What is the Ġ character in GPT-2 vocab files?",
     "In GPT-2's vocabulary Ġ stands for a leading space, so Ġhello is ' hello'."),
    ("What do [INST] tags do?", "In Llama 2 prompts [INST] and [/INST] wrap each user turn."),
])
def test_markers_talked_about_are_ok(prompt, text):
    assert assess(text, prompt=prompt) == ("ok", [])


@pytest.mark.parametrize("prompt,text,code", [
    # The marker sits at a chat-template position in the prompt: that is not talk about it.
    ("Name a prime.<|eot_id|>", "Seven.<|eot_id|>\n\nQ: next", "special_token"),
    ("<|user|>\nhello\n<|assistant|>", "Hi!\n<|user|>\nhello", "special_token"),
    ("Tell me a joke.", "Why did the cat sit?assistant\n\nWhy did the cat sit?", "special_token"),
    ("Summarise.", "[INST] Summarise the text [/INST] It is about boats.", "special_token"),
    ("Hi", "<s><s><s><s>", "special_token"),
    ("Hi", "Hello<0x0A>there", "byte_token"),
])
def test_marker_leaks_are_degenerate(prompt, text, code):
    verdict, reasons = assess(text, prompt=prompt)
    assert verdict == "degenerate"
    assert any(r.startswith(code) for r in reasons), reasons


@pytest.mark.parametrize("prompt,text", [
    ("Quelle est la capitale du Canada ?", "La capitale du Canada est Ottawa, en Ontario."),
    ("¿Qué hora es en Madrid cuando en Lima son las diez?", "Cuando en Lima son las diez, en "
     "Madrid son las cinco de la tarde en invierno."),
    ("Translate into Greek: good night", "Καληνύχτα"),
    ("用英文回答：太阳从哪边升起？", "The sun rises in the east."),
    ("How do you write 'water' in Korean?", "Water is 물 (mul) in Korean."),
    ("Écris une phrase en allemand sur le train.", "Der Zug fährt pünktlich um acht Uhr ab."),
    ("Как дела?", "Спасибо, всё хорошо! А у вас?"),
])
def test_the_prompts_or_the_requested_language_is_ok(prompt, text):
    assert assess(text, prompt=prompt) == ("ok", [])


@pytest.mark.parametrize("prompt,text", [
    ("How are you today?", "我很好，谢谢你的关心。今天天气不错。"),
    ("你今天好吗？请用中文回答。", "I am fine, thank you, the weather is nice today."),
    ("Answer in English: what is a GPU?", "Графический процессор — это устройство для "
     "параллельных вычислений."),
    ("", "The queue drains when the worker идет на обед and returns later."),
    ("", "The cache is flushed 然后重新加载 before the next request arrives."),
    ("", "日本語で説明します。 그러나 결과를 먼저 확인합니다."),
])
def test_unasked_language_switches_are_degenerate(prompt, text):
    verdict, reasons = assess(text, prompt=prompt)
    assert verdict == "degenerate"
    assert any(r.startswith("language_switch") for r in reasons), reasons


def test_latin_language_switch_needs_the_language_judge(libraries):
    """French asked, English answered: pycld2 on the controller; the host misses it."""
    prompt = "Bonjour ! Peux-tu m'expliquer comment fonctionne une file d'attente ?"
    text = "Sure. A queue holds items in the order they arrive and hands them out first in, " \
           "first out."
    if judges()["language"] != "stdlib":
        verdict, reasons = assess(text, prompt=prompt)
        assert verdict == "degenerate"
        assert any(r.startswith("language_switch") for r in reasons), reasons
    textcheck.use_libraries(False)
    assert judges()["language"] == "stdlib"
    assert assess("Bien sûr ! Une file d'attente sert les éléments dans l'ordre.",
                  prompt=prompt) == ("ok", [])


@pytest.mark.parametrize("text", [
    "```python\nfor key, value in sorted(table.items()):\n    print(f\"{key}: {value}\")\n```",
    "id,name,score\n1,ana,9.5\n2,bo,7.25\n3,cy,8.0\n4,dee,6.75",
    '{"items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], "total": 3}',
    "00000000  7f 45 4c 46 02 01 01 00  00 00 00 00 00 00 00 00  |.ELF............|",
    "| host | gpu | ok |\n|---|---|---|\n| n1 | H100 | yes |\n| n2 | H100 | yes |",
    "sha1: da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune.",
])
def test_code_and_data_are_ok(text):
    assert assess(text, prompt="Show me an example.") == ("ok", [])


@pytest.mark.parametrize("text,code", [
    ("Paris lamp ocean violin glacier harvest pencil thunder meadow", "word_salad"),
    ("The model loads fast.reserveTokenизm_of__ qq<Hint fooBarBaz99 zzz_A_b", "word_salad"),
    ("A caf\u00c3\u00a9 on the corner sells cr\u00c3\u00aapes.", "mojibake"),
    ("Weights load from the cache, cache,cache,, cache,cache,, then run.", "stutter"),
    ("Line one.\u0120\u0120Line two\u010aLine three", "bpe_marker"),
    ("Step 1: check the cable and plug.\nStep 2: check the cable and plug.\n"
     "Step 3: check the cable and plug.\nStep 4: check the cable and plug.", "templated_loop"),
    (",,, ;; ,\n,, ...", "punctuation_only"),
])
def test_new_degenerate_rules(text, code):
    verdict, reasons = assess(text)
    assert verdict == "degenerate"
    assert any(r.startswith(code) for r in reasons), reasons


# --- cross-prompt check ----------------------------------------------------------------------

def test_same_output_for_different_prompts_is_flagged():
    answer = "The capital of France is Paris, a city on the Seine."
    reasons = same_output_reasons([
        ("capital", "What is the capital of France?", answer),
        ("sum", "What is 2 + 2?", answer),
        ("poem", "Write a haiku.", "Leaves fall on the pond"),
    ])
    assert len(reasons) == 1
    assert reasons[0].startswith("same_output: capital, sum")


def test_same_output_accepts_dicts_and_ignores_whitespace_and_case():
    reasons = same_output_reasons([
        {"name": "a", "prompt": "Explain TCP.", "output": "I cannot help with that request today."},
        {"name": "b", "prompt": "Explain UDP.",
         "output": "i cannot  help with that\nrequest today."},
    ])
    assert len(reasons) == 1


@pytest.mark.parametrize("items", [
    [("a", "2+2?", "4"), ("b", "8/2?", "4")],                      # short answers coincide
    [("a", "Capital of France?", "Paris."), ("b", "Where is the Louvre?", "Paris.")],
    [("a", "Say hi.", "Hello there, how can I help you today?"),   # same prompt twice
     ("b", "Say hi.", "Hello there, how can I help you today?")],
    [("a", "x", "One long answer about queues and stacks."), ("b", "y", "Another one.")],
    [],
])
def test_same_output_not_flagged(items):
    assert same_output_reasons(items) == []


# --- the stdlib-only host path ------------------------------------------------------------------

_BLOCKED_RUN = r"""
import sys, importlib.abc

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"ftfy", "wordfreq", "pycld2", "regex", "langcodes", "numpy",
                                  "msgpack", "wcwidth", "locate"}:
            raise ImportError("blocked: " + name)
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[1])
from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck import judge as t
assert all(t._lib(name) is None for name in ("ftfy.badness", "pycld2", "wordfreq"))
j = t.judges()
assert j["library_backed"] is False, j
cases = [
    ("hello", "你好！有什么可以帮你的吗？", "degenerate"),
    ("Repeat 'go' 5 times.", "go go go go go", "ok"),
    ("", "The caf\u00c3\u00a9 is open.", "degenerate"),
    ("", "Paris<|im_end|><|im_start|>", "degenerate"),
    ("Was ist die Hauptstadt?", "Die Hauptstadt ist Berlin.", "ok"),
]
for prompt, text, want in cases:
    got = t.assess(text, prompt=prompt)[0]
    assert got == want, (prompt, text, got)
same = "The service is unavailable, please try again later."
print(t.same_output_reasons([("a", "p1", same), ("b", "p2", same)]) and "ok")
"""


def test_stdlib_only_path_imports_and_judges_without_libraries():
    proc = subprocess.run([sys.executable, "-I", "-c", _BLOCKED_RUN, COLLECTIONS],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_judges_reports_the_library_judges(libraries):
    j = judges()
    assert j["rules"] == "stdlib"
    assert set(j) == {"rules", "mojibake", "language", "vocabulary", "library_backed"}
    textcheck.use_libraries(False)
    assert judges()["library_backed"] is False
    assert all(judges()[k] == "stdlib" for k in ("mojibake", "language", "vocabulary"))


def test_library_judges_installed_in_the_project_venv():
    """The controller venv has the pinned judges (ee/requirements.txt)."""
    pytest.importorskip("ftfy")
    pytest.importorskip("pycld2")
    pytest.importorskip("wordfreq")
    textcheck.use_libraries(True)
    j = judges()
    assert j["library_backed"] is True
    assert j["mojibake"].startswith("ftfy ") and j["language"].startswith("pycld2 ")


def test_chat_message_prompts_are_read_as_their_contents():
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say 'go' four times."}]
    assert assess("go go go go", prompt=messages) == ("ok", [])
    assert assess("走吧走吧，我们现在就出发去车站。", prompt=messages)[0] == "degenerate"
