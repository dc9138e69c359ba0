"""Prompt features for the fast text predictors (`text-gbm`, `lexical-gbm`), batch-first.

Everything here reads only what a request carries before it runs: the prompt text, its token
count and the served model's name. All functions take a batch (lists) and return numpy arrays
(or a scipy CSR matrix for the n-grams), one row per request.

- `token_counts(texts)`: exact o200k_base token counts (toktok-rs, offline, exact as tiktoken),
  memoised in an LRU dict keyed by a hash of the text (`TokenCounter`).
- `lexical_cues(texts)`: `CUE_NAMES`, ~40 cheap hand cues (sizes, structure, question and task
  words, length requests such as "in 3 sentences" / "500 words", code markers, language hints).
- `NgramHasher`: hashed word 1–2-grams and char 3–5-grams (within words) of the head and tail
  of the prompt, tf-idf-like sublinear weights, each block l2-normalised; no vocabulary to
  store, so the featuriser has no fitted state beyond its parameters.
- `model_features(models)`: `MODEL_FEATURE_NAMES`: a served model's family (parsed from its name,
  so an unseen model of a known family still says something), its parameter count (log, parsed
  from names like "Llama-3.1-8B" / "Mixtral-8x7B"), and whether it is an "instruct"/"it" tune.

Costs per prompt, batched, one core of a shared, loaded machine, CASTILLO prompts (mean 670
chars): cues ~85 µs, n-grams ~60-120 µs (one Rust encode + numpy), token count ~5 µs (~80 µs
uncached on long prompts).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

# --- token counts ---------------------------------------------------------------------------
ENCODING = "o200k_base"


class TokenCounter:
    """o200k_base counts with an LRU memo keyed by the text's blake2b hash (16 bytes)."""

    def __init__(self, encoding: str = ENCODING, maxsize: int = 65_536) -> None:
        self.encoding = encoding
        self.maxsize = maxsize
        self._memo: OrderedDict[bytes, int] = OrderedDict()

    @staticmethod
    def _key(text: str) -> bytes:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        import toktok

        keys = [self._key(t) for t in texts]
        out = np.empty(len(texts), dtype=np.int64)
        missing: dict[bytes, list[int]] = {}
        for i, k in enumerate(keys):
            v = self._memo.get(k)
            if v is None:
                missing.setdefault(k, []).append(i)
            else:
                self._memo.move_to_end(k)
                out[i] = v
        if missing:
            firsts = [idx[0] for idx in missing.values()]
            counts = toktok.batch_count([texts[i] for i in firsts], self.encoding, threads=1)
            for (k, idx), c in zip(missing.items(), counts):
                out[idx] = c
                self._memo[k] = int(c)
            while len(self._memo) > self.maxsize:
                self._memo.popitem(last=False)
        return out


_COUNTER = TokenCounter()


def token_counts(texts: Sequence[str]) -> np.ndarray:
    """Exact o200k_base token counts of `texts` (shared LRU memo)."""
    return _COUNTER(texts)


# --- lexical cues ---------------------------------------------------------------------------
_NUMWORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
             "eight": 8, "nine": 9, "ten": 10, "twenty": 20, "fifty": 50, "hundred": 100,
             "a": 1, "single": 1}  # fmt: skip
_UNIT_TOKENS = {"word": 1.3, "sentence": 25, "line": 12, "paragraph": 120, "item": 20, "point": 25,
                "bullet": 25, "example": 60, "step": 40, "tip": 40, "idea": 40, "question": 30,
                "reason": 40, "character": 0.3, "token": 1.0, "page": 600}  # fmt: skip
_QWORDS = frozenset(["what", "how", "why", "when", "where", "who", "whom", "which", "whose", "is", "are", "was", "were", "can", "could", "do", "does", "did", "should", "would", "will", "name", "tell"])  # fmt: skip
_BULLET = re.compile(r"^[ \t]*(?:[-*•]|\d{1,3}[.)])[ \t]", re.MULTILINE)
_CODE_LINE = re.compile(r"^(?:[ \t]*(?:def |class |import |from \S+ import|return\b|#|//|[{}])|    \S|.*;[ \t]*$)",
                        re.MULTILINE)  # fmt: skip
_PUNCT_CHARS = b"!\"$%&'()*,./:;<>?@[\\]^`{|}~=\n\t\r"
# punctuation -> space on the UTF-8 bytes (C speed; ASCII bytes never occur inside a multi-byte
# character, so this equals str.translate on the text, 5x faster)
_PUNCT = bytes.maketrans(_PUNCT_CHARS, b" " * len(_PUNCT_CHARS))

# keyword flags: (name, whole words, phrases). Matched on the lower-cased text with punctuation
# turned into spaces: a word must be a whole word; a phrase a substring padded by spaces.
_FLAGS: list[tuple[str, str, tuple[str, ...]]] = [
    ("kw_list", "list lists enumerate bullet bullets bulleted", ("name some", "name a few", "give me some",
                                                                 "give me a few")),
    ("kw_explain", "explain explaining describe discuss why elaborate", ()),
    ("kw_long_form", ("essay story poem letter email article blog report speech narrative song lyrics "
                     "outline plan guide tutorial script"), ("cover letter",)),
    ("kw_write", "write compose draft create generate design develop build", ()),
    ("kw_code", ("code function program implement script class method algorithm python javascript java "
                "sql regex api html css react bash c++ numpy pandas"), ()),
    ("kw_short", "briefly brief concise concisely short shortly tldr tl;dr", (
        "one word", "single word", "yes or no", "true or false", "one sentence", "one-liner",
        "in a word", "only the")),
    ("kw_detail", "detailed comprehensive thorough step-by-step in-depth complete", (
        "in detail", "step by step", "in depth")),
    ("kw_classify", "classify categorize categorise identify sentiment label", (
        "which of the following", "is it")),
    ("kw_extract", "extract find", ("given the text", "from the text", "from the passage",
                                    "reference text", "based on", "from the paragraph")),
    ("kw_summarize", "summarize summarise summary tldr", ("in short",)),
    ("kw_rewrite", "rewrite rephrase paraphrase edit correct fix improve translate convert", ()),
    ("kw_math", "calculate compute solve equation probability", ("how many", "how much", "sum of")),
    ("kw_compare", "compare comparison difference differences versus vs", ("pros and cons",)),
    ("kw_example", "example examples e.g. instance", ("such as", "for instance")),
    ("kw_test", "assert >>> testcase testcases", ("sample input", "example input", "-----input-----",
                                                "input format", "output format")),
    ("kw_solution_stub", "todo", ("solution start", "begin solution", "# solution")),
    ("kw_chat", "hi hello hey thanks please", ("thank you",)),
]
# word -> bit mask of the flags it sets; a phrase is searched only when its longest word occurs
_FLAG_WORDS: dict[str, int] = {}
_FLAG_PHRASES: dict[str, list[tuple[int, str]]] = {}
for _j, (_, _ws, _ph) in enumerate(_FLAGS):
    for _w in _ws.split():
        _FLAG_WORDS[_w] = _FLAG_WORDS.get(_w, 0) | 1 << _j
    for _p in _ph:
        _FLAG_PHRASES.setdefault(max(_p.split(), key=len), []).append((1 << _j, f" {_p} "))
_FLAG_BITS = np.uint64(1) << np.arange(len(_FLAGS), dtype=np.uint64)

CUE_NAMES: tuple[str, ...] = (
    "log_chars",          # log1p(characters)
    "log_words",          # log1p(whitespace words)
    "log_lines",          # log1p(newlines)
    "log_bullets",        # log1p(lines starting with -, *, •, "1." or "1)")
    "n_question_marks",   # count of '?' (capped at 20)
    "ends_question",      # stripped text ends with '?'
    "starts_question",    # first word is a question word (what/how/why/.../can/does/name/tell)
    "log_digits",         # log1p(digits)
    "frac_upper",         # upper-case letters / letters
    "frac_code_chars",    # chars in {}[]()=;<>_#/\ per char (code density)
    "frac_nonascii",      # non-ASCII chars per char (non-English hint)
    "frac_cjk",           # CJK / kana / hangul chars per char
    "code_fences",        # count of ``` (capped at 10)
    "log_code_lines",     # log1p(lines that look like code: def/class/import/return/#/{/;/indent)
    "mean_word_len",      # letters / words
    "log_last_line",      # log1p(chars of the last non-empty line: often the actual ask)
    "log_first_line",     # log1p(chars of the first line)
    "count_request",      # a numeric length request was found ("in 3 sentences", "500 words")
    "log_requested",      # log1p(rough tokens implied: n x tokens-per-unit; largest request)
    *(n for n, _, _ in _FLAGS),  # keyword flags (0/1), see _FLAGS
)
_CLIP_HEAD, _CLIP_TAIL = 1200, 600
_UNIT_WORDS = frozenset(u + s for u in _UNIT_TOKENS for s in ("", "s"))
# byte classes for counting with bytes.translate (C speed): count = len(b) - len(b minus class)
_B_DIGIT = bytes(range(48, 58))
_B_UPPER = bytes(range(65, 91))
_B_LOWER = bytes(range(97, 123))
_B_CODE = b"{}[]()=;<>_#/\\"
_B_LEAD = bytes(range(0xC0, 0x100))  # first byte of each non-ASCII character
_B_CJK = bytes(range(0xE3, 0xEE))    # lead bytes of U+3000..U+DFFF (kana, CJK, hangul)


def _requested_tokens(words: list[str], wset: set[str]) -> float:
    """Largest "N units" request (N a number or number word up to two words before the unit),
    in rough tokens: N x tokens per unit."""
    if _UNIT_WORDS.isdisjoint(wset):
        return 0.0
    best = 0.0
    for i, w in enumerate(words):
        if w in _UNIT_WORDS and i:
            unit = w[:-1] if w.endswith("s") and w[:-1] in _UNIT_TOKENS else w
            for prev in words[max(i - 2, 0):i][::-1]:
                if prev.isdigit() and len(prev) <= 5:
                    n = float(prev)
                elif prev in _NUMWORDS:
                    n = float(_NUMWORDS[prev])
                else:
                    continue
                best = max(best, min(n, 10_000.0) * _UNIT_TOKENS[unit])
                break
    return best


def _count(b: bytes, cls: bytes) -> int:
    return len(b) - len(b.translate(None, cls))


def _text_cues(text: str, clip: str) -> tuple[list[float], int]:
    """The numeric cues of one text, and the bit mask of its keyword flags."""
    norm = " " + clip.lower().encode("utf-8", "surrogatepass").translate(_PUNCT).decode("utf-8", "surrogatepass") + " "
    words = norm.split()
    wset = set(words)
    stripped = text.strip()
    first = stripped.split("\n", 1)[0]
    last = stripped[stripped.rfind("\n") + 1:] if "\n" in stripped else stripped
    req = _requested_tokens(words, wset)
    b = clip.encode("utf-8", "surrogatepass")
    n = max(len(clip), 1)
    upper, lower_n = _count(b, _B_UPPER), _count(b, _B_LOWER)
    letters = max(upper + lower_n, 1)
    row = [
        math.log1p(len(text)),
        math.log1p(len(words)),
        math.log1p(text.count("\n")),
        math.log1p(len(_BULLET.findall(clip))),
        min(text.count("?"), 20),
        float(stripped.endswith("?")),
        float(bool(words) and words[0] in _QWORDS),
        math.log1p(_count(b, _B_DIGIT)),
        upper / letters,
        _count(b, _B_CODE) / n,
        _count(b, _B_LEAD) / n,
        _count(b, _B_CJK) / n,
        min(text.count("```"), 10),
        math.log1p(len(_CODE_LINE.findall(clip))),
        (upper + lower_n) / len(words) if words else 0.0,
        math.log1p(len(last)),
        math.log1p(len(first)),
        float(req > 0),
        math.log1p(req),
    ]
    mask = 0
    for w in wset.intersection(_FLAG_WORDS):
        mask |= _FLAG_WORDS[w]
    for w in wset.intersection(_FLAG_PHRASES):
        for bit, phrase in _FLAG_PHRASES[w]:
            if not mask & bit and phrase in norm:
                mask |= bit
    return row, mask


def lexical_cues(texts: Sequence[str]) -> np.ndarray:
    """(n, len(CUE_NAMES)) float64 matrix of hand cues, one row per text. Sizes use the whole
    text; pattern cues and character fractions its first 1,200 and last 600 characters."""
    clipped = [t if len(t) <= _CLIP_HEAD + _CLIP_TAIL else t[:_CLIP_HEAD] + "\n" + t[-_CLIP_TAIL:] for t in texts]
    rows, masks = zip(*[_text_cues(t, c) for t, c in zip(texts, clipped)]) if texts else ((), ())
    out = np.empty((len(texts), len(CUE_NAMES)))
    k = len(CUE_NAMES) - len(_FLAGS)
    out[:, :k] = np.array(rows, dtype=np.float64).reshape(len(texts), k)
    out[:, k:] = (np.array(masks, dtype=np.uint64)[:, None] & _FLAG_BITS) != 0
    return out


# --- hashed n-grams -------------------------------------------------------------------------
_MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


class NgramHasher:
    """Hashed n-grams of o200k token ids (1..`order`-grams), fully vectorised.

    Texts are lower-cased and encoded in one Rust call (toktok `encode_batch_to_numpy`); BPE
    tokens are sub-word pieces, so unigrams act like word pieces / char n-grams and 2–3-grams
    like word n-grams. Only the first `head` and last `tail` tokens of each text are used (the
    ask is usually at one end; bounds the cost of long prompts). Each n-gram is hashed
    (multiply-xorshift on the id tuple) into `2**bits` columns; per-order blocks share the
    space. Counts are sublinear (log1p) and rows l2-normalised. CSR float32, no fitted state.
    """

    def __init__(self, bits: int = 18, order: int = 3, head: int = 384, tail: int = 128) -> None:
        self.params = {"bits": bits, "order": order, "head": head, "tail": tail}
        self.n_features = 2**bits

    def __call__(self, texts: Sequence[str]):
        import scipy.sparse as sp
        import toktok

        order, head, tail = (self.params[k] for k in ("order", "head", "tail"))
        n = len(texts)
        ids, off = toktok._encoding(ENCODING).encode_batch_to_numpy([t.lower() for t in texts], 1)
        ids = np.asarray(ids, dtype=np.uint64)
        off = np.asarray(off, dtype=np.int64)
        lens = np.diff(off)
        row = np.repeat(np.arange(n), lens)
        pos = np.arange(ids.size) - off[:-1][row]
        keep = (pos < head) | (pos >= (lens[row] - tail))
        ids, row = ids[keep], row[keep]
        cols, rows = [], []
        with np.errstate(over="ignore"):
            for k in range(order):
                if k == 0:
                    h = (ids + np.uint64(1)) * _MIX1
                    hk, rk = h, row
                else:
                    h = (h[:-1] ^ (ids[k:] + np.uint64(k + 1))) * _MIX2
                    same = row[k:] == row[:-k]
                    hk, rk = h[same], row[k:][same]
                hk = hk ^ (hk >> np.uint64(29))
                cols.append((hk & np.uint64(self.n_features - 1)).astype(np.int64))
                rows.append(rk)
        # distinct (row, column) pairs and their counts, sorted: CSR in canonical form directly
        # (scipy's COO -> CSR conversion and sum_duplicates cost ~0.15 ms for one short text)
        key = np.concatenate(rows) * np.int64(self.n_features) + np.concatenate(cols)
        key.sort()
        first = np.flatnonzero(np.diff(key, prepend=key[:1] - 1))  # empty when no text has a token
        counts = np.diff(np.append(first, key.size)).astype(np.float32)
        key = key[first]
        r = key // self.n_features
        indptr = np.searchsorted(r, np.arange(n + 1))
        data = np.log1p(counts)
        per_row = np.diff(indptr)
        norms = np.sqrt(np.bincount(r, data.astype(np.float64) ** 2, minlength=n))
        data /= np.repeat(np.where(per_row > 0, norms, 1.0), per_row).astype(np.float32)
        return sp.csr_matrix((data, key % self.n_features, indptr), shape=(n, self.n_features))


# --- served-model features ------------------------------------------------------------------
FAMILIES = ("llama", "qwen", "gemma", "mistral", "phi", "deepseek", "gpt", "other")
MODEL_FEATURE_NAMES = ("family", "log_params", "is_instruct")
_PARAMS = re.compile(r"(?:(\d+)x)?(\d+(?:\.\d+)?)\s*([bm])(?![a-z0-9])", re.IGNORECASE)


def model_family(model: str) -> int:
    """Index in FAMILIES of a model name (Mixtral/Ministral count as mistral)."""
    m = model.lower()
    for i, f in enumerate(FAMILIES[:-1]):
        if f in m or (f == "mistral" and ("mixtral" in m or "ministral" in m)):
            return i
    return len(FAMILIES) - 1


def model_params(model: str) -> float:
    """Parameter count in billions parsed from the name ("8x7B" = 56), NaN if absent. A "1M"
    suffix (context length, as in Qwen2.5-7B-Instruct-1M) is ignored when a B size is present."""
    best = math.nan
    for k, x, unit in _PARAMS.findall(model.split("/")[-1].split("--")[-1]):
        v = float(x) * (float(k) if k else 1.0)
        if unit.lower() == "b":
            return v
        if math.isnan(best):
            best = v / 1000.0
    return best


def model_features(models: Sequence[str]) -> np.ndarray:
    """(n, 3): family index, log(params in B) (NaN unknown), instruct/chat tune flag."""
    cache: dict[str, list[float]] = {}
    rows = []
    for m in models:
        if m not in cache:
            p = model_params(m)
            low = m.lower()
            cache[m] = [float(model_family(m)), math.log(p) if not math.isnan(p) and p > 0 else math.nan,
                        float(any(s in low for s in ("instruct", "-it", "chat")))]  # fmt: skip
        rows.append(cache[m])
    return np.array(rows, dtype=np.float64).reshape(len(models), 3)
