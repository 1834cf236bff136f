"""Deterministic "greedy decoding" for the stand-in: tokenizer, token ids, known answers, prose.

Tokens are words / punctuation pieces with their leading whitespace, so joining the tokens of a
text gives the text back exactly (that is how the cumulative streaming text is built).  Token
ids come from SHA-256 of the token text (stable across runs, never 0; id 0 is "!" and is only
produced by the broken-NaN mode).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Optional, Sequence

TOKEN_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")
VOCAB_SIZE = 151936
EOS_TOKEN_ID = 151645
BANG_TOKEN = "!"
BANG_TOKEN_ID = 0

WARMUP_PROMPT = "The capital city of France is"

# THE table of known answers (prompt -> exact greedy completion).  Keys are matched after
# normalise(): case-insensitive, whitespace collapsed.  The probe uses exactly these prompts.
KNOWN_ANSWERS = {
    "What is 2 + 2? Answer with a number only.": "4",
    "What is the capital of France? Answer in one word.": "Paris.",
    WARMUP_PROMPT: " Paris.",
    "List the first five prime numbers, separated by commas.": "2, 3, 5, 7, 11",
    "Write a Python function named square that returns the square of its argument.": (
        "```python\n"
        "def square(x):\n"
        "    \"\"\"Return the square of x.\"\"\"\n"
        "    return x * x\n"
        "```"
    ),
}

# Built-in prose for every other prompt: a seeded choice of sentences, never repeating one.
SENTENCES = (
    "Large language models generate text one token at a time.",
    "Each new token depends on every token that came before it.",
    "Speculative decoding lets a small draft model propose several tokens at once.",
    "The target model then verifies the whole proposal in a single forward pass.",
    "Accepted tokens are kept, and the first rejected one is replaced by the target's choice.",
    "When the draft agrees often, the server emits more tokens per step.",
    "Decode speed on a single request is usually limited by memory bandwidth.",
    "Batching many requests together makes better use of the GPU's compute units.",
    "The key-value cache stores attention state so that earlier tokens are not recomputed.",
    "A larger cache lets the scheduler keep more requests running at the same time.",
    "Tensor parallelism splits every layer's weights across several GPUs.",
    "The GPUs exchange partial results after each layer over fast interconnects.",
    "CUDA graphs record a sequence of kernels so it can be replayed with little overhead.",
    "Replaying a captured graph removes much of the launch cost of small decode steps.",
    "Prefill processes the whole prompt in parallel before decoding begins.",
    "Time to first token grows with the length of the prompt.",
    "A radix tree lets requests that share a prefix reuse the same cached attention state.",
    "Greedy decoding always picks the single most likely next token.",
    "Sampling with a temperature trades determinism for variety.",
    "A tokenizer maps text to integer ids that the model understands.",
    "Most modern vocabularies contain more than one hundred thousand tokens.",
    "Mixed precision formats such as bfloat16 halve the memory needed for weights.",
    "Quantized weights reduce memory further at a small cost in accuracy.",
    "An inference server exposes health checks so that orchestration can route traffic safely.",
    "Readiness should only be reported once the model can actually answer requests.",
    "Metrics such as throughput and queue length help operators spot trouble early.",
    "A deployment is only finished when a real request returns a sensible answer.",
    "Rolling updates replace one server at a time to keep the service available.",
    "Configuration management tools make every host converge to the same declared state.",
    "Idempotent tasks can be run again without changing a host that is already correct.",
    "Different GPU generations support different attention kernels.",
    "A kernel tuned for one architecture may fail or misbehave on another.",
    "Benchmarks should report both the median and the tail of the latency distribution.",
    "Throughput alone can hide a server that returns fast but meaningless output.",
    "Careful validation compares generated text with answers that are known in advance.",
    "Logs from the start-up sequence show where a failing server stopped.",
    "Memory that is not reserved for the cache is needed for activations and graphs.",
    "Setting the static memory fraction too high leaves too little room for the rest.",
    "Draft models are trained to imitate the hidden states of their target model.",
    "Tree-based verification checks several candidate continuations in one pass.",
)

GARBAGE_WORDS = ("the", ",", " the", ";", " of", " of", "...", " token", " --", " and", " ,",
                 " model", "!!", " the", " ::", " data")


def normalise(text: str) -> str:
    return " ".join(text.split()).lower()


_KNOWN_NORMALISED = {normalise(k): v for k, v in KNOWN_ANSWERS.items()}


def tokenize(text: str) -> list:
    return TOKEN_RE.findall(text)


def token_id(token: str) -> int:
    digest = hashlib.sha256(token.encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:4], "big") % (EOS_TOKEN_ID - 1)


def ids_for(tokens: Sequence[str]) -> list:
    return [token_id(t) for t in tokens]


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


_CHAT_TURN_RE = re.compile(r"<\|im_start\|>\s*user\s*\n(.*?)(?:<\|im_end\|>|$)", re.S)


def extract_prompt(text: str) -> str:
    """The last user turn if the text carries a ChatML template, else the text itself."""
    turns = _CHAT_TURN_RE.findall(text)
    return turns[-1] if turns else text


def known_answer(prompt: str) -> Optional[str]:
    return _KNOWN_NORMALISED.get(normalise(extract_prompt(prompt)))


def prose_sentences(prompt: str) -> list:
    """Indexes into SENTENCES of the prose for ``prompt`` (3-6 distinct, seeded by the prompt)."""
    rng = random.Random(_seed(normalise(prompt)))
    count = 3 + rng.randrange(4)
    return rng.sample(range(len(SENTENCES)), count)


def prose_for(prompt: str) -> str:
    """Coherent, non-repetitive prose seeded by the prompt (3-6 distinct sentences)."""
    return "".join(" " + SENTENCES[i] for i in prose_sentences(prompt))


# --- the target's confidence: top-2 logprob margins -------------------------------------------
# Which sentence comes next is where a model is least sure: in prose, every odd-numbered sentence
# start (the 2nd, 4th, ...) is a near tie between two sentences; every other position is
# confident.  A correct speculative decoder may flip a near tie (kernel numerics); only a broken
# one leaves the target's tokens where the target was confident (DDTREE_LAB_FAULT, faults.py).
NEAR_TIE_MARGIN = (0.01, 0.2)      # nats, top-1 minus top-2, at near ties
CONFIDENT_MARGIN = (1.5, 8.0)      # everywhere else
TOP1_LOGPROB = (-0.6, -0.01)
ALT_TOKEN = " the"                 # runner-up inside a sentence


def _unit(*parts) -> float:
    """A stable number in [0, 1) from the parts."""
    return _seed("\x1f".join(str(p) for p in parts)) / float(1 << 64)


def _between(lo_hi, *parts) -> float:
    lo, hi = lo_hi
    return round(lo + (hi - lo) * _unit(*parts), 4)


def _runner_up(picked: list, j: int) -> int:
    """The sentence a flip at sentence start ``j`` continues with (its first token differs)."""
    first = tokenize(" " + SENTENCES[picked[j]])[0]
    order = picked[j + 1:] + [i for i in range(len(SENTENCES)) if i not in picked]
    return next(i for i in order if tokenize(" " + SENTENCES[i])[0] != first)


@dataclass
class Completion:
    tokens: list          # token strings, in order
    ids: list             # output ids, same length
    finish_type: str      # "stop" | "length"
    matched: object = None  # stop string, or EOS id for a natural stop
    margins: Optional[list] = None    # per token: top-1 minus top-2 logprob (nats)
    alts: Optional[list] = None       # per token: the runner-up token

    def top_logprobs(self, k: int, key: str = "") -> list:
        """SGLang's output_top_logprobs: per position, k [logprob, token_id, null] triples."""
        out = []
        for i, tok in enumerate(self.tokens):
            lp1 = _between(TOP1_LOGPROB, key, i, tok)
            margin = self.margins[i] if self.margins else CONFIDENT_MARGIN[0]
            alt = self.alts[i] if self.alts else ALT_TOKEN
            row = [[lp1, self.ids[i], None], [round(lp1 - margin, 4), token_id(alt), None]]
            for extra in range(2, k):
                row.append([round(lp1 - margin - 1.0 - extra, 4), token_id("#%d" % extra), None])
            out.append(row[:k])
        return out

    def token_logprobs(self, key: str = "") -> list:
        """SGLang's output_token_logprobs: per position [logprob, token_id, null]."""
        return [[_between(TOP1_LOGPROB, key, i, tok), self.ids[i], None]
                for i, tok in enumerate(self.tokens)]


def _prose(prompt: str, diverge: Optional[str], after: int):
    """(tokens, margins, alts) of the prose answer, optionally leaving it at one sentence start.

    diverge: None (the target's own greedy text), "near_tie" (take the runner-up at the first near
    tie: what a correct decoder may do) or "confident" (take it at the first confident sentence
    start at or after token ``after``: a lossless violation, still fluent).
    """
    picked = prose_sentences(prompt)
    starts, count = [], 0
    for i in picked:
        starts.append(count)
        count += len(tokenize(" " + SENTENCES[i]))
    if diverge is not None:
        near_tie = diverge == "near_tie"
        choices = [j for j in range(1, len(picked))
                   if (j % 2 == 1) == near_tie and (near_tie or starts[j] >= after)]
        if choices:
            j = choices[0]
            runner = _runner_up(picked, j)
            swapped = picked[:j] + [runner] + [i for i in picked[j:] if i != runner]
            return _prose_from(prompt, swapped[:len(picked)])
    return _prose_from(prompt, picked)


def _prose_from(prompt: str, picked: list):
    tokens, margins, alts = [], [], []
    for j, i in enumerate(picked):
        toks = tokenize(" " + SENTENCES[i])
        for n, tok in enumerate(toks):
            if n == 0 and j >= 1:
                near = j % 2 == 1
                margins.append(_between(NEAR_TIE_MARGIN if near else CONFIDENT_MARGIN,
                                        prompt, len(tokens)))
                alts.append(tokenize(" " + SENTENCES[_runner_up(picked, j)])[0])
            else:
                margins.append(_between(CONFIDENT_MARGIN, prompt, len(tokens)))
                alts.append(ALT_TOKEN if tok != ALT_TOKEN else " a")
            tokens.append(tok)
    return tokens, margins, alts


def garbage_tokens(prompt: str, n: int) -> list:
    rng = random.Random(_seed("garbage:" + prompt))
    return [rng.choice(GARBAGE_WORDS) for _ in range(n)]


def complete(prompt: str, max_new_tokens: Optional[int], *, mode: str = "correct",
             chat: bool = False, stop: Sequence[str] = (), ignore_eos: bool = False,
             diverge: Optional[str] = None, diverge_after: int = 0) -> Completion:
    """The greedy completion of ``prompt``.

    mode: "correct" (known answer or prose), "bang" (token 0 "!" until max_new_tokens),
    "garbage" (word salad until max_new_tokens).  ``max_new_tokens`` None = no limit.
    diverge / diverge_after: leave the target's prose at a near tie or a confident position
    (_prose); known answers are never affected.
    """
    limit = max_new_tokens if max_new_tokens is not None else 4096
    if mode == "bang":
        toks = [BANG_TOKEN] * limit
        return Completion(toks, [BANG_TOKEN_ID] * limit, "length")
    if mode == "garbage":
        toks = garbage_tokens(prompt, limit)
        return Completion(toks, ids_for(toks), "length")

    answer = known_answer(prompt)
    margins = alts = None
    if answer is None:
        tokens, margins, alts = _prose(extract_prompt(prompt), diverge, diverge_after)
        answer = "".join(tokens)
    if chat:
        answer = answer.lstrip()
    if margins is None or chat:
        tokens = tokenize(answer)
        margins = [_between(CONFIDENT_MARGIN, prompt, i) for i in range(len(tokens))]
        alts = [ALT_TOKEN if t != ALT_TOKEN else " a" for t in tokens]
    finish, matched = "stop", EOS_TOKEN_ID
    if ignore_eos and len(tokens) < limit:
        # keep "generating": continue with further prose, like a model forced past EOS
        extra = tokenize(prose_for("continue:" + prompt))
        while len(tokens) < limit:
            tokens.extend(extra)
    if stop:
        text = ""
        for i, tok in enumerate(tokens):
            text += tok
            hit = next((s for s in stop if s and s in text), None)
            if hit is not None:
                cut = text.index(hit)
                kept = tokenize(text[:cut])
                if i + 1 <= limit:
                    return Completion(kept, ids_for(kept), "stop", hit,
                                      margins[:len(kept)], alts[:len(kept)])
                break
    if len(tokens) > limit:
        tokens = tokens[:limit]
        finish, matched = "length", None
    elif ignore_eos:
        finish, matched = "length", None
    n = len(tokens)
    margins = (margins + [CONFIDENT_MARGIN[1]] * n)[:n]
    alts = (alts + [ALT_TOKEN] * n)[:n]
    return Completion(tokens, ids_for(tokens), finish, matched, margins, alts)
