"""The issue #30 rules of the text judge, each with a degenerate case it must catch (for the
expected reason) and a near miss it must leave alone.  The texts are written for these tests,
not taken from the corpora.
"""

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck import judge as textcheck
from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck.judge import assess


@pytest.fixture(params=[True, False], ids=["controller", "stdlib"])
def mode(request):
    textcheck.use_libraries(request.param)
    yield request.param
    textcheck.use_libraries(True)


def _caught(text, code, prompt=None):
    verdict, reasons = assess(text, prompt=prompt)
    assert verdict == "degenerate", reasons
    assert any(r.startswith(code) for r in reasons), reasons
    return reasons


def _ok(text, prompt=None):
    assert assess(text, prompt=prompt) == ("ok", [])


# --- whitespace_run ------------------------------------------------------------------------

def test_whitespace_runaway_is_caught(mode):
    reasons = _caught('{"city": "Lyon", "zip": "69001"}' + "\n" * 40, "whitespace_run",
                      prompt="Answer in JSON.")
    assert "40 line breaks" in reasons[0]
    _caught('{"items": [' + " \t" * 60, "whitespace_run")


def test_indentation_and_blank_lines_are_ok(mode):
    _ok("def f(x):\n" + " " * 32 + "return x  # deep but normal\n\n\n\ndef g():\n    pass")
    _ok("Section one.\n\n\n\nSection two, after three blank lines.")


# --- word_doubling -------------------------------------------------------------------------

def test_every_word_doubled_is_caught(mode):
    _caught("WeWe are are going going to to the the park park now", "word_doubling",
            prompt="Where are you going?")


def test_an_occasional_double_word_is_ok(mode):
    _ok("It was very, very cold, and the the bus was late, so we walked home together.")
    _ok("- step 1\n- step 2\n- step 3\n- step 4\n- step 5\n- step 6")


# --- only_unit -----------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["BerlinBerlinBerlin", "yes sir yes sir yes sir yes sir",
                                  "Ok. Ok. Ok. Ok. Ok."])
def test_one_piece_as_the_whole_answer_is_caught(mode, text):
    _caught(text, "only_unit", prompt="Tell me about your weekend.")


def test_one_piece_the_prompt_asks_for_or_laughter_is_ok(mode):
    _ok("Berlin Berlin Berlin Berlin", prompt="Say 'Berlin' four times.")
    _ok("Hahahaha!", prompt="Tell me a joke.")
    _ok("Bye bye!", prompt="See you.")


# --- repeated_text -------------------------------------------------------------------------

_PARA = ("The harbour opens at six and the first ferry leaves for the island when the tide "
         "is high enough for the heavy boats to clear the sand bar by the lighthouse. ")


def test_a_paragraph_said_three_times_is_caught(mode):
    _caught("Here is the schedule.\n" + (_PARA + "\n") * 3, "repeated_text",
            prompt="When does the harbour open?")


def test_a_refrain_the_prompt_asks_for_is_ok(mode):
    verse = ("Row the boat along the river, row it past the mill and tower,\n"
             "sing it softly, sing it slowly, sing it every passing hour.\n")
    _ok(verse * 3, prompt="Write a song with the same verse three times.")
    _ok(_PARA + "Tickets are sold on the quay; children under five travel free, and bikes "
        "cost two euros each way. The last ferry back leaves at nine in summer.")


# --- prompt_echo ---------------------------------------------------------------------------

def test_the_prompt_said_back_is_caught(mode):
    _caught("question: Fix the spelling. text: Teh cat sat. answer: The cat sat.",
            "prompt_echo", prompt="Fix the spelling. Teh cat sat.")


def test_an_answer_that_restates_the_question_is_ok(mode):
    _ok("The capital of Peru is Lima, on the Pacific coast.",
        prompt="What is the capital of Peru?")
    _ok("Sure: Teh cat sat -> The cat sat.", prompt="Fix the spelling: Teh cat sat.")


# --- short salad, fragment salad -----------------------------------------------------------

def test_short_nonsense_is_caught_with_the_library():
    # Controller only (wordfreq looks the words up); the host judges it ok: it cannot.
    _caught("zorbt glimmerax frunkel of", "word_salad", prompt="What is the time?")
    textcheck.use_libraries(False)
    try:
        assert assess("zorbt glimmerax frunkel of", prompt="What is the time?")[0] == "ok"
    finally:
        textcheck.use_libraries(True)


def test_short_nonsense_with_symbols_inside_words_is_caught(mode):
    _caught("gr*mble fl@rp answer", "word_salad", prompt="What is the time?")


def test_short_real_answers_are_ok(mode):
    _ok("It is half past four.", prompt="What is the time?")
    _ok("Use GGUF Q4_K_M for an 8 GB card.", prompt="Which quantization?")
    _ok("Ġermanja u Ċipru huma pajjiżi Ewropej.", prompt="Ikteb sentenza.")


def test_glued_fragment_soup_is_caught(mode):
    text = ("you can the help a helpyou writeem message can a youcan writeist em "
            "messagewrite the canhelp ist a write you help messageem can the emcan "
            "a thehelp ist you write message can the a help")
    _caught(text, "word_salad")


# --- scripts and languages -----------------------------------------------------------------

def test_vietnamese_prose_is_not_salad(mode):
    _ok("Mùa thu ở Hà Nội rất đẹp, lá vàng rơi trên những con phố nhỏ quanh hồ Tây và "
        "người ta thường uống cà phê trứng vào buổi sáng se lạnh.",
        prompt="Viết về mùa thu ở Hà Nội.")


def test_math_notation_is_not_a_language_switch(mode):
    _ok("Let xᵢ ∈ ℝ and Δx = xᵢ − xᵢ₋₁; then ∑ᵢ₌₁ⁿ f(xᵢ)Δx → ∫ₐᵇ f(x) dx, and "
        "σ² = E[(X − μ)²] with α = 0.05.", prompt="Explain Riemann sums.")


def test_a_real_switch_into_greek_is_still_caught(mode):
    _caught("The server restarts every night at two and then it loads the model again, "
            "και μετά φορτώνει.",
            "language_switch", prompt="When does the server restart?")


# --- hard good cases -----------------------------------------------------------------------

def test_morse_code_is_ok(mode):
    _ok("-- --- .-. ... . / -.-. --- -.. .", prompt="Write MORSE CODE in Morse.")
    _ok(".--. .. -. --.", prompt="Encode PING.")


def test_punctuation_soup_is_still_caught(mode):
    _caught(";;, ,,; ::. ,;,", "punctuation_only")


def test_requested_dna_repeats_are_ok(mode):
    _ok("5'-GC" + "TTA" * 10 + "GC-3'", prompt="Write a sequence with TTA repeated ten times.")
    _ok("The complement of ACCGGTTA is TGGCCAAT.", prompt="Complement ACCGGTTA.")


def test_unrequested_dna_style_loop_is_caught(mode):
    _caught("AT" * 200, "only_unit", prompt="What is DNA?")


def test_replacement_character_explained_is_ok(mode):
    _ok("U+FFFD (\ufffd) is what a decoder writes for bytes it cannot read.",
        prompt="What is this symbol?")
    _ok("Those \ufffd\ufffd marks are undecodable bytes: set the terminal to UTF-8.",
        prompt="Why does my log show \ufffd\ufffd?")


def test_replacement_character_in_an_answer_is_still_caught(mode):
    _caught("The weather in Paris is \ufffd\ufffd sunny today.", "replacement_char",
            prompt="Weather in Paris?")


# --- round 2 (held-out procedure) rules ---------------------------------------------------------

def test_symbol_loop_caught_and_short_symbol_rows_ok(mode):
    _caught("The path is " + "'/" * 20, "symbol_loop")
    _ok("Separator rows: ===== and ----- and a table | a | b |.")


def test_doubly_escaped_text_caught_and_plain_json_escapes_ok(mode):
    _caught('{"a": "\\\\u4e0a\\\\u5e02\\\\u516c\\\\u53f8"}', "mojibake")
    _ok('{"name": "\\u4e0a\\u5e02", "city": "Paris"}')


def test_traditional_answer_to_simplified_prompt_caught_and_same_variant_ok(mode):
    _caught("這個問題很簡單，我們從頭開始說。", "language_switch", prompt="请你简单说说这个问题。")
    _ok("这个问题很简单，我们从头开始说。", prompt="请你简单说说这个问题。")


def test_glued_script_caught_and_spaced_or_hangul_particles_ok(mode):
    _caught("Two episodes: 1 hour + 1 hour群 = 2 hours in total.", "language_switch")
    _ok("Run the tests with Python을 사용해서 확인하세요.", prompt="테스트는 어떻게 실행해요?")


def test_glosses_in_parentheses_ok_and_bare_runs_still_caught(mode):
    _ok("Dumplings (饺子) and buns (包子) are both served at breakfast.",
        prompt="Name two breakfast foods in China.")
    _caught("The cache is flushed 然后重新加载 before the next request.", "language_switch")


def test_tex_math_is_notation_and_salad_still_caught(mode):
    _ok("令 $b_n = n a_n$，则 $b_{n+1} = b_n + 1$，所以 $a_n = \\frac{n+2}{n}$。",
        prompt="求 $a_n$ 的通项。")
    _caught("fooBarBaz99 zzz_A_b qq<Hint reserveTokenизm_of__", "word_salad")


def test_named_tokens_in_an_explanation_ok_and_leaks_still_caught(mode):
    _ok("<|im_end|> ends a turn; the template wraps messages as <|im_start|>user ... and the "
        "server should stop on that token.", prompt="What is <|im_end|>?")
    _caught("Sure!<|im_start|>user\nhi", "special_token", prompt="Say hi.")


def test_song_verses_and_one_word_sentences_asked_for_ok(mode):
    verse = "{0} bottles of beer on the wall, {0} bottles of beer.\nTake one down and pass it " \
            "around, {1} bottles of beer on the wall.\n\n"
    _ok("".join(verse.format(n, n - 1) for n in (10, 9, 8)).strip(),
        prompt="Write three verses of the bottles of beer song.")
    _ok("Police police police police police.", prompt="Write a sentence made only of the word "
        "'police'.")
    _caught("police police police police police police", "word_run", prompt="Who polices?")


def test_digit_grids_and_variable_pairs_ok(mode):
    _ok("\n".join(["1 1 1 1 1 1 1 1 1 1"] * 10), prompt="Print a 10x10 grid of ones.")
    _ok("For a, b > 0: (a + b)/2 >= sqrt(a b), since a b <= ((a + b)/2)^2; with a b = 4 and "
        "a + b = 5 the mean 2.5 beats 2; a b fixed, a + b is least when a = b.")
