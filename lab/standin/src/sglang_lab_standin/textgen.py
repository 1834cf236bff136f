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


def prose_for(prompt: str) -> str:
    """Coherent, non-repetitive prose seeded by the prompt (3-6 distinct sentences)."""
    rng = random.Random(_seed(normalise(prompt)))
    count = 3 + rng.randrange(4)
    picked = rng.sample(range(len(SENTENCES)), count)
    return "".join(" " + SENTENCES[i] for i in picked)


@dataclass
class Completion:
    tokens: list          # token strings, in order
    ids: list             # output ids, same length
    finish_type: str      # "stop" | "length"
    matched: object = None  # stop string, or EOS id for a natural stop


def garbage_tokens(prompt: str, n: int) -> list:
    rng = random.Random(_seed("garbage:" + prompt))
    return [rng.choice(GARBAGE_WORDS) for _ in range(n)]


def complete(prompt: str, max_new_tokens: Optional[int], *, mode: str = "correct",
             chat: bool = False, stop: Sequence[str] = (), ignore_eos: bool = False) -> Completion:
    """The greedy completion of ``prompt``.

    mode: "correct" (known answer or prose), "bang" (token 0 "!" until max_new_tokens),
    "garbage" (word salad until max_new_tokens).  ``max_new_tokens`` None = no limit.
    """
    limit = max_new_tokens if max_new_tokens is not None else 4096
    if mode == "bang":
        toks = [BANG_TOKEN] * limit
        return Completion(toks, [BANG_TOKEN_ID] * limit, "length")
    if mode == "garbage":
        toks = garbage_tokens(prompt, limit)
        return Completion(toks, ids_for(toks), "length")

    answer = known_answer(prompt)
    if answer is None:
        answer = prose_for(extract_prompt(prompt))
    if chat:
        answer = answer.lstrip()
    tokens = tokenize(answer)
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
                    return Completion(kept, ids_for(kept), "stop", hit)
                break
    if len(tokens) > limit:
        tokens = tokens[:limit]
        finish, matched = "length", None
    elif ignore_eos:
        finish, matched = "length", None
    return Completion(tokens, ids_for(tokens), finish, matched)
