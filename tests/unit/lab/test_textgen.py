"""Deterministic text: tokenizer round trip, stable ids, known answers, prose."""

import subprocess
import sys

import pytest

from sglang_lab_standin import textgen
from sglang_lab_standin.textgen import complete

PROBES = {
    "What is 2 + 2? Answer with a number only.": "4",
    "What is the capital of France? Answer in one word.": "Paris.",
    "The capital city of France is": " Paris.",
    "List the first five prime numbers, separated by commas.": "2, 3, 5, 7, 11",
}


@pytest.mark.parametrize("prompt, answer", PROBES.items())
def test_known_answers(prompt, answer):
    c = complete(prompt, 64)
    assert "".join(c.tokens) == answer and c.finish_type == "stop"


def test_known_answers_normalised_and_inside_chat_template():
    assert "".join(complete("  what is 2 + 2?   answer with a NUMBER only. ", 8).tokens) == "4"
    chat = ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
            "What is the capital of France? Answer in one word.<|im_end|>\n<|im_start|>assistant\n")
    assert "".join(complete(chat, 8, chat=True).tokens) == "Paris."


def test_square_function_is_correct_python():
    text = "".join(complete("Write a Python function named square that returns the square of its argument.", 200).tokens)
    assert text.startswith("```python\n") and text.endswith("```")
    code = text.split("```python\n", 1)[1].rsplit("```", 1)[0]
    ns = {}
    exec(code, ns)  # noqa: S102 - our own deterministic output
    assert ns["square"](7) == 49


def test_tokenizer_round_trip_and_ids():
    text = "Hello, world!  It's 2 + 2 = 4.\n```x```"
    toks = textgen.tokenize(text)
    assert "".join(toks) == text
    ids = textgen.ids_for(toks)
    assert all(0 < i < textgen.VOCAB_SIZE for i in ids)


def test_ids_stable_across_processes():
    code = "import sys; sys.path.insert(0, sys.argv[1]); from sglang_lab_standin import textgen; print(textgen.token_id(' Paris'))"
    out = {subprocess.run([sys.executable, "-c", code, textgen.__file__.rsplit("/sglang_lab_standin", 1)[0]],
                          capture_output=True, text=True, env={"PYTHONHASHSEED": str(seed)}).stdout.strip()
           for seed in (1, 2)}
    assert out == {str(textgen.token_id(" Paris"))}


def test_prose_is_deterministic_coherent_and_non_repeating():
    a = complete("Tell me about GPUs", None)
    b = complete("Tell me about GPUs", None)
    assert a.tokens == b.tokens and a.finish_type == "stop"
    text = "".join(a.tokens).strip()
    sentences = [s for s in text.split(". ") if s]
    assert len(sentences) == len(set(sentences)) >= 3
    assert all(s.strip() in " ".join(textgen.SENTENCES) for s in sentences)
    assert complete("Something else entirely", None).tokens != a.tokens


def test_truncation_gives_length():
    c = complete("Tell me about GPUs", 5)
    assert len(c.tokens) == 5 and c.finish_type == "length"


def test_bang_and_garbage_modes():
    b = complete("anything", 4, mode="bang")
    assert b.tokens == ["!"] * 4 and b.ids == [0, 0, 0, 0] and b.finish_type == "length"
    g = complete("anything", 30, mode="garbage")
    assert len(g.tokens) == 30 and 0 not in g.ids
    assert "".join(g.tokens) not in "".join(textgen.SENTENCES)


def test_stop_strings():
    c = complete("List the first five prime numbers, separated by commas.", 64, stop=[", 5"])
    assert "".join(c.tokens) == "2, 3" and c.finish_type == "stop" and c.matched == ", 5"


FREEFORM = ("Explain in a few sentences why speculative decoding makes large language model "
            "inference faster.")


def _first_diff(a, b):
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def test_divergence_leaves_the_target_at_a_near_tie_or_a_confident_sentence_start():
    target = complete(FREEFORM, 96)
    tie = complete(FREEFORM, 96, diverge="near_tie")
    wrong = complete(FREEFORM, 96, diverge="confident")
    k_tie, k_wrong = _first_diff(target.ids, tie.ids), _first_diff(target.ids, wrong.ids)
    assert target.margins[k_tie] < 0.5 <= 1.5 <= target.margins[k_wrong]
    # The runner-up the target lists at that position is what the flipped candidate took.
    assert target.alts[k_tie] == tie.tokens[k_tie] and target.alts[k_wrong] == wrong.tokens[k_wrong]
    # Still fluent prose made of whole sentences, the same length class.
    for c in (tie, wrong):
        text = "".join(c.tokens)
        assert text.endswith(".") and all(s.strip() + "." in " ".join(textgen.SENTENCES)
                                          for s in text.split(".")[:-1])
    # A later start is honoured; known answers are never touched.
    later = complete(FREEFORM, 96, diverge="confident", diverge_after=k_wrong + 1)
    assert later.ids == target.ids or _first_diff(target.ids, later.ids) > k_wrong
    for prompt, answer in PROBES.items():
        assert "".join(complete(prompt, 64, diverge="confident").tokens) == answer


def test_lossless_faults_parse():
    from sglang_lab_standin.faults import parse_fault
    assert parse_fault("lossless_violation").tokens == 0
    assert parse_fault("lossless_violation:16").tokens == 16
    assert parse_fault("near_tie_flip").kind == "near_tie_flip"
    for bad in ("lossless_violation:x", "lossless_violation:-1", "near_tie_flip:3"):
        with pytest.raises(ValueError):
            parse_fault(bad)
