"""assess(): a corpus of legitimate outputs that must stay 'ok' and broken
outputs that must be flagged, with the reason code checked."""

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck.judge import assess, expect_matches, find_loops

GOOD = {
    "digit": "4",
    "digit_period": "4.",
    "paris": "Paris.",
    "primes": "2, 3, 5, 7, 11",
    "yes": "Yes",
    "python_square": "```python\ndef square(x):\n    return x * x\n```",
    "python_class": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
        "    def push(self, item):\n        self.items.append(item)\n\n"
        "    def pop(self):\n        return self.items.pop()\n\n"
        "    def peek(self):\n        return self.items[-1]\n\n"
        "    def empty(self):\n        return not self.items\n"),
    "python_ruler_comment": (
        "# " + "-" * 70 + "\n# Helpers\n# " + "-" * 70 + "\n"
        "def f(x):\n    return x + 1\n"),
    "python_banner": 'print("=" * 40)\nprint("Report")\nprint("=" * 40)\n',
    "c_braces": "int main(void) {\n  for (;;) {\n    if (x) {\n      y();\n    }\n  }\n  return 0;\n}\n",
    "json": '{"name": "Ada", "tags": ["a", "b", "c"], "nested": {"k": [1, 2, 3], "ok": true}}',
    "json_zero_matrix": '{"matrix": [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]}',
    "json_zero_row": "[" + "0, " * 40 + "0]",
    "wide_table_sep": "| " + " | ".join("c%d" % i for i in range(14)) + " |\n" + "|---" * 14 + "|",
    "numpy_zeros": "array([[0., 0., 0., 0., 0., 0.],\n       [0., 0., 0., 0., 0., 0.]])",
    "markdown_table": (
        "| Model | Speed | Quality |\n| --- | --- | --- |\n"
        "| A | 10 | good |\n| B | 20 | fair |\n| C | 30 | poor |\n"),
    "markdown_wide_sep": "| a | b | c | d | e | f | g | h |\n|---|---|---|---|---|---|---|---|\n| 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 |",
    "markdown_checkmarks": "| Feature | v1 | v2 | v3 | v4 |\n|---|---|---|---|---|\n| Fast | ✓ | ✓ | ✓ | ✓ |\n| Safe | ✓ | ✓ | ✓ | ✓ |",
    "list_items": "- item 1\n- item 2\n- item 3\n- item 4\n- item 5\n- item 6\n- item 7",
    "numbered_steps": "1. Step one: open the file.\n2. Step two: read it.\n3. Step three: close it.\n4. Step four: done.",
    "todo_list": "- [ ] buy milk\n- [ ] buy eggs\n- [ ] buy bread\n- [x] buy coffee",
    "song_refrain": (
        "We sail at dawn across the grey\n"
        "And sing the morning into day\n"
        "Row, row, row the boat ashore\n"
        "The tide will carry us once more\n"
        "Row, row, row the boat ashore\n"
        "The wind is cold, the sea is wide\n"
        "Row, row, row the boat ashore\n"
        "We'll find our home on the other side"),
    "chorus_twice": (
        "Verse one about a city at night.\n\n"
        "Chorus:\nHold on, hold on, the light is coming\nHold on, hold on, the light is coming\n\n"
        "Verse two about the morning train."),
    "chinese": "推测解码使用一个小的草稿模型来预测多个词元，然后由大模型一次性验证，因此推理速度更快。",
    "japanese": "投機的デコードでは、小さなモデルが候補を出し、大きなモデルがまとめて検証します。",
    "arabic": "فك التشفير التخميني يجعل الاستدلال أسرع لأن النموذج الكبير يتحقق من عدة رموز في خطوة واحدة.",
    "russian": "Спекулятивное декодирование ускоряет вывод: маленькая модель предлагает токены, а большая их проверяет.",
    "emoji": "Great job! 🎉🎉🎉 Keep going 🚀",
    "korean_laugh": "ㅋㅋㅋㅋㅋ 정말 웃기다",
    "wow": "Wow!!! That is amazing.",
    "really": "Really?! Are you sure?",
    "ellipsis": "Well... I suppose so... maybe.",
    "big_number": "The answer is 1000000.",
    "pi": "Pi is approximately 3.14159265358979.",
    "float_third": "1/3 in floating point is 0.3333333333333333.",
    "very_very": "It is very, very, very important.",
    "ha_ha": "Ha ha ha ha, that is a good one.",
    "knock": "Knock knock. Who's there?",
    "url": "See https://example.com/a/b/c?x=1&y=2 for details.",
    "rst_heading": "Title\n=====\n\nSome text.\n\nSection\n-------\n\nMore text.",
    "dotted_leaders": "Chapter 1 ........................ 5\nChapter 2 ........................ 17",
    "sparkline": "Load over the day: ▁▂▃▅▇▅▃▂▁ peak at noon.",
    "maltese": "Ġermanja u Ċipru huma pajjiżi Ewropej.",
    "html_strike": "Price: <s>$20</s> $15",
    "prose": (
        "Speculative decoding lets a small, fast draft model guess several upcoming tokens. "
        "The large target model then checks all of those guesses in one forward pass, "
        "which costs about the same as generating a single token. Every accepted guess is "
        "a token the large model did not have to produce sequentially, so throughput rises "
        "while the output distribution stays exactly the same."),
    "trailing_eos": "Paris.<|endoftext|>",
    "hex_dump": "0x00 0x00 0x00 0x01",
    "binary": "0b" + bin(3 ** 100)[2:],
    "regex_answer": "Use the pattern ^[a-z]+$ to match lowercase words.",
    "sql": "SELECT id, name FROM users WHERE id IN (1, 2, 3) ORDER BY name;",
    "french_spacing": "Bonjour ! Comment allez-vous ? Très bien ; merci beaucoup : à demain.",
    "code_swap_loop": ("for i in range(n):\n    for j in range(n):\n        if a[i][j] > a[j][i]:\n"
                       "            a[i][j], a[j][i] = a[j][i], a[i][j]\n"),
    "yes_no_table": "| Feature | v1 | v2 | v3 | v4 | v5 |\n|---|---|---|---|---|---|\n" + "".join(
        "| %s | Yes | No | Yes | Yes | No |\n" % f
        for f in ["Fast", "Safe", "Small", "Cheap", "Open", "Stable", "Quiet", "Light"]),
    "em_dashes": ("The draft model — small and fast — proposes tokens; the target — large and "
                  "slow — checks them. Most proposals — often four or five — are accepted."),
    "yaml": "- name: install\n  apt:\n    name: nginx\n- name: start\n  service:\n    name: nginx\n",
}

BAD = {
    "bangs": ("!!!!!!!!", "char_run"),
    "bangs_long": ("!" * 200, "char_run"),
    "four_bangs_only": ("!!!!", "only_char"),
    "question_marks": ("The answer is ??????????", "char_run"),
    "the_the": ("the the the the", "word_run"),
    "the_the_in_text": ("I think that the the the the the cat sat.", "word_run"),
    "word_run_caps": ("Paris Paris Paris Paris Paris", "word_run"),
    "phrase_loop": ("I am a helpful assistant. " * 8, "phrase_loop"),
    "phrase_loop_no_punct": ("and then we went " * 6, "phrase_loop"),
    "sorry_loop": ("Sure! " + "I'm sorry, I cannot help with that. " * 5, "phrase_loop"),
    "cjk_loop": ("这是一个测试。" * 10, "phrase_loop"),
    "russian_loop": ("это тест " * 12, "phrase_loop"),
    "four_salad": ("4 4 4 4 4 4 4 salad salad salad salad", "word_run"),
    "endoftext_mid": ("Paris.<|endoftext|>The capital of", "special_token"),
    "im_end": ("Paris.<|im_end|>", "special_token"),
    "im_start_mid": ("Sure<|im_start|>assistant\nSure", "special_token"),
    "unk": ("The <unk> of <unk> is <unk>.", "special_token"),
    "byte_token": ("Hello<0x0A>world<0x0A>", "byte_token"),
    "bpe_g": ("HelloĠworldĠhowĠareĠyou", "bpe_marker"),
    "bpe_c": ("line oneĊline twoĊline three", "bpe_marker"),
    "sentencepiece": ("▁The▁capital▁of▁France▁is▁Paris", "sentencepiece_marker"),
    "sp_run": ("Paris ▁▁▁▁▁▁▁▁▁▁▁▁", "char_run"),
    "replacement": ("Paris \ufffd\ufffd is nice", "replacement_char"),
    "replacement_single": ("caf\ufffd", "replacement_char"),
    "empty": ("", "empty_output"),
    "whitespace": ("   \n\t  ", "empty_output"),
    "letter_run": ("aaaaaaaaaaaaaaaaaaaaaaaa", "char_run"),
    "low_diversity": ("ab " * 80, "phrase_loop"),
    "alternating_punct": ("!." * 100, "low_char_diversity"),
    "dot_comma": (".,.,.,.,.;" * 30, "low_char_diversity"),
    "tail_loop_length": ("The capital of France is Paris. It is known for it is known for it is known for it is known for",
                         "phrase_loop"),
    "hash_emoji_run": ("🎉" * 20, "char_run"),
    "zero_digits_excess": ("0" * 40, "char_run"),
    "word_salad": (" of the ;; model , the and -- of :: data the , of the ... model and the ; of"
                   " data :: the , and of -- the model ; the of , data", "word_salad"),
    "word_salad_glued": ("the,, ofthe :: modelthe ; and the ... of of data -- the , the and ; "
                         "data the of :: model , the the of ; and the data , of", "word_salad"),
    "word_soup_low_diversity": (" ".join(["cat", "dog", "cat", "cat", "dog"] * 20), "low_word_diversity"),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_text_is_ok(name):
    verdict, reasons = assess(GOOD[name])
    assert (verdict, reasons) == ("ok", []), (name, reasons)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_text_is_degenerate(name):
    text, code = BAD[name]
    verdict, reasons = assess(text)
    assert verdict == "degenerate", (name, reasons)
    assert any(r.startswith(code) for r in reasons), (name, code, reasons)


def test_corpus_sizes():
    assert len(GOOD) >= 40 and len(BAD) >= 30


def test_incident_reason_shape():
    verdict, reasons = assess("!!!!!!!!")
    assert verdict == "degenerate"
    assert reasons[0] == "char_run: '!' x 8"


def test_emphatic_but_short_bangs_ok():
    assert assess("Stop!!!!!")[0] == "ok"          # 5 is below CHAR_RUN_BANG
    assert assess("Stop!!!!!!")[0] == "degenerate"  # 6 is at it


def test_refrain_three_times_with_other_lines_ok():
    text = ("Sing along now\nLa la la, we are free\nThe road goes on\n"
            "La la la, we are free\nThe night is long\nLa la la, we are free\nThe end")
    assert assess(text) == ("ok", [])


def test_three_repeats_ok_unless_cut_at_length():
    text = "Answer: the model verifies drafts. the model verifies drafts. the model verifies drafts."
    assert assess(text, finish_reason="stop") == ("ok", [])
    verdict, reasons = assess(text, finish_reason="length")
    assert verdict == "degenerate"
    assert any(r.startswith("length_in_loop") for r in reasons)
    # SGLang's dict form of finish_reason works the same.
    assert assess(text, finish_reason={"type": "length", "length": 24})[0] == "degenerate"


def test_length_detected_from_output_ids_and_max_tokens():
    text = "Explain: it repeats it repeats it repeats it repeats"
    verdict, reasons = assess(text, output_ids=list(range(8)), max_tokens=8)
    assert verdict == "degenerate"
    assert any(r.startswith("length_in_loop") for r in reasons)


def test_long_loop_without_finish_info_is_tail_loop():
    text = "Intro sentence here. " + "we keep going around " * 6
    verdict, reasons = assess(text)
    assert verdict == "degenerate"
    assert any(r.startswith("tail_loop") for r in reasons)


def test_token_id_zero_run():
    verdict, reasons = assess("Hello there, friend.", output_ids=[9, 8, 0, 0, 0, 0, 0, 0, 7])
    assert verdict == "degenerate"
    assert reasons == ["token_id_run: id 0 x 6"]


def test_token_id_zero_short_run_ok():
    assert assess("Hello!!", output_ids=[9, 0, 0]) == ("ok", [])


def test_token_id_any_run():
    verdict, reasons = assess("Fine text here.", output_ids=[5] * 40)
    assert verdict == "degenerate"
    assert reasons == ["token_id_run: id 5 x 40"]


@pytest.mark.parametrize("text,expect", [
    ("4", r"4\.?"),
    ("  4\n", r"4\.?"),
    ("4.", r"4"),
    ("Paris.", r"Paris\.?"),
    ("**Paris**", r"Paris\.?"),
    ("`4`", r"4"),
    ("2, 3, 5, 7, 11", r"2,\s*3,\s*5,\s*7,\s*11\.?"),
    ("2,3,5,7,11.", r"2,\s*3,\s*5,\s*7,\s*11\.?"),
])
def test_expect_ok(text, expect):
    assert assess(text, expect=expect) == ("ok", [])


@pytest.mark.parametrize("text,expect", [
    ("The answer is 5", r"4\.?"),
    ("5", r"4\.?"),
    ("44", r"4\.?"),
    ("4 4 4 4 4 4 salad", r"4\.?"),
    ("Paris is the capital of France.", r"Paris\.?"),
    ("London.", r"Paris\.?"),
    ("2, 3, 5, 7, 9", r"2,\s*3,\s*5,\s*7,\s*11\.?"),
])
def test_expect_wrong(text, expect):
    verdict, reasons = assess(text, expect=expect)
    assert verdict == "wrong"
    assert reasons[0].startswith("expect_mismatch")


def test_degenerate_wins_over_wrong_and_keeps_both_reasons():
    verdict, reasons = assess("!!!!!!!!", expect=r"4\.?")
    assert verdict == "degenerate"
    assert reasons[0].startswith("char_run")
    assert reasons[-1].startswith("expect_mismatch")


def test_bad_expect_regex_is_reported():
    verdict, reasons = assess("4", expect="(")
    assert verdict == "wrong"
    assert reasons[0].startswith("bad_expect_regex")


def test_expect_matches_helper():
    assert expect_matches("Paris.", r"Paris")
    assert not expect_matches("Paris, France", r"Paris\.?")


def test_find_loops_reports_unit_and_repeats():
    loops = find_loops("xx " + "abcd" * 5 + " yy")
    units = {(lp["unit"], round(lp["repeats"])) for lp in loops}
    assert ("abcd", 5) in units


def test_none_and_non_string_inputs():
    assert assess(None)[0] == "degenerate"
    assert assess(4) == ("ok", [])


def test_long_good_text_is_fast():
    import time
    text = GOOD["prose"] * 1 + "\n" + GOOD["python_class"] * 3
    t0 = time.monotonic()
    assert assess(text)[0] in ("ok", "degenerate")
    assert time.monotonic() - t0 < 2.0
