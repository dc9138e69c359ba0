"""Prompt features for the fast text predictors (`text-gbm`, `lexical-gbm`), batch-first.

Everything here reads only what a request carries before it runs: the prompt text, its token
count and the served model's name. All functions take a batch (lists) and return numpy arrays
(or a scipy CSR matrix for the n-grams), one row per request.

- `encode(texts)`: o200k_base token ids of a batch in one Rust call (toktok-rs, offline, exact
  as tiktoken); their offsets give the exact token counts.
- `NgramHasher`: hashed 1..k-grams of those token ids from the head and tail of the prompt,
  sublinear counts, rows l2-normalised; no vocabulary to store, no fitted state.
- `lexical_cues(texts)`: `CUE_NAMES`, 36 cheap hand cues (sizes, structure, question and task
  words, length requests such as "in 3 sentences" / "500 words", code markers, language hints),
  computed on UTF-8 bytes with C-speed string methods.
- `model_features(models)`: `MODEL_FEATURE_NAMES`: a served model's family (parsed from its name,
  so an unseen model of a known family still says something), its parameter count (log, parsed
  from names like "Llama-3.1-8B" / "Mixtral-8x7B"), and whether it is an "instruct"/"it" tune.

Costs per prompt, batched (calls of 64 CASTILLO prompts, mean 670 characters, one core):
`python benchmarks/text_gbm_cost.py` measures each stage.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

# --- tokens -------------------------------------------------------------------------------
ENCODING = "o200k_base"


def encode(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """o200k_base token ids of `texts` in one Rust call (toktok): (ids uint64, offsets int64),
    text i's ids at ids[offsets[i]:offsets[i+1]]. np.diff(offsets) are the exact token counts."""
    import toktok

    ids, off = toktok._encoding(ENCODING).encode_batch_to_numpy(list(texts), 1)
    return np.asarray(ids, dtype=np.uint64), np.asarray(off, dtype=np.int64)


# --- lexical cues ---------------------------------------------------------------------------
# word tables are bytes: the cues compare them with words of the lower-cased UTF-8 text
_NUMWORDS = {b"one": 1.0, b"two": 2.0, b"three": 3.0, b"four": 4.0, b"five": 5.0, b"six": 6.0, b"seven": 7.0,
             b"eight": 8.0, b"nine": 9.0, b"ten": 10.0, b"twenty": 20.0, b"fifty": 50.0, b"hundred": 100.0,
             b"a": 1.0, b"single": 1.0}  # fmt: skip
_UNIT_TOKENS = {b"word": 1.3, b"sentence": 25, b"line": 12, b"paragraph": 120, b"item": 20, b"point": 25,
                b"bullet": 25, b"example": 60, b"step": 40, b"tip": 40, b"idea": 40, b"question": 30,
                b"reason": 40, b"character": 0.3, b"token": 1.0, b"page": 600}  # fmt: skip
_UNIT_TOKENS.update({u + b"s": v for u, v in list(_UNIT_TOKENS.items())})  # plurals
_UNIT_WORDS = frozenset(_UNIT_TOKENS)
_QWORDS = frozenset(b"what how why when where who whom which whose is are was were can could do does did should "
                    b"would will name tell".split())  # fmt: skip
# line patterns, run on b"\n" + the UTF-8 bytes: a pattern that starts with a literal "\n" is
# only tried at newlines (a MULTILINE "^" is tried at every byte: measured 3x slower)
_BULLET = re.compile(rb"\n[ \t]*(?:[-*]|\xe2\x80\xa2|\d{1,3}[.)])[ \t]")  # -, *, •, 1. 1)
_CODE_LINE = re.compile(rb"\n(?:[ \t]*(?:def |class |import |from \S+ import|return\b|#|//|[{}])|    \S|[^\n]*;[ \t]*(?=\n|\Z))")
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
_FLAG_WORDS: dict[bytes, int] = {}
_FLAG_PHRASES: dict[bytes, list[tuple[int, bytes]]] = {}
for _j, (_, _ws, _ph) in enumerate(_FLAGS):
    for _w in _ws.split():
        _FLAG_WORDS[_w.encode()] = _FLAG_WORDS.get(_w.encode(), 0) | 1 << _j
    for _p in _ph:
        _FLAG_PHRASES.setdefault(max(_p.split(), key=len).encode(), []).append((1 << _j, f" {_p} ".encode()))
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
_LOG1P = [i for i, n in enumerate(CUE_NAMES) if n.startswith("log_")]  # stored as log1p(value)
# byte classes: one bytes.translate maps every byte to its class letter, then bytes.count per
# class (C speed). d digit, u upper, l lower, c code punctuation, j lead byte of U+3000..U+DFFF
# (kana, CJK, hangul), n lead byte of another non-ASCII character, . anything else
_CLASSES = bytearray(b"." * 256)
for _cls, _bytes in ((b"d", range(48, 58)), (b"u", range(65, 91)), (b"l", range(97, 123)),
                     (b"c", b"{}[]()=;<>_#/\\"), (b"n", range(0xC0, 0x100)), (b"j", range(0xE3, 0xEE))):  # fmt: skip
    for _b in _bytes:
        _CLASSES[_b] = _cls[0]
_CLASSES = bytes(_CLASSES)


# every whole word a cue looks for: flag words, the key word of each phrase, length units
_KEY_WORDS = frozenset(_FLAG_WORDS) | frozenset(_FLAG_PHRASES) | _UNIT_WORDS
# key word -> (flag bits it sets, (bit, phrase) pairs it gates, whether it is a length unit)
_KEY_INFO = {w: (_FLAG_WORDS.get(w, 0), tuple(_FLAG_PHRASES.get(w, ())), w in _UNIT_WORDS) for w in _KEY_WORDS}


def _requested_tokens(words: list[bytes], units: list[bytes]) -> float:
    """Largest "N units" request (N a number or number word up to two words before the unit),
    in rough tokens: N x tokens per unit. `units`: the unit words that occur in `words`."""
    best = 0.0
    for u in units:
        i = 0
        while True:
            try:
                i = words.index(u, i) + 1  # C-speed scan to the next occurrence
            except ValueError:
                break
            for prev in words[max(i - 3, 0):i - 1][::-1]:
                if prev.isdigit() and len(prev) <= 5:
                    n = float(prev)
                elif prev in _NUMWORDS:
                    n = _NUMWORDS[prev]
                else:
                    continue
                best = max(best, min(n, 10_000.0) * _UNIT_TOKENS[u])
                break
    return best


def _text_cues(text: str, clip: str) -> tuple[list[float], int]:
    """The raw numeric cues of one text (`_LOG1P` columns not yet logged), and the bit mask of
    its keyword flags. Word cues read the normalised clip: ASCII lower-cased UTF-8 bytes,
    punctuation as spaces, padded by spaces. Every step is one C-speed bytes/str method."""
    b = clip.encode("utf-8", "surrogatepass")
    norm = b" " + b.lower().translate(_PUNCT) + b" "
    words = norm.split()  # bytes, not str: ~3x cheaper to split and look up
    mask, units = 0, []
    for w in _KEY_WORDS.intersection(words):
        bits, phrases, unit = _KEY_INFO[w]
        mask |= bits
        for bit, phrase in phrases:
            if not mask & bit and phrase in norm:
                mask |= bit
        if unit:
            units.append(w)
    req = _requested_tokens(words, units) if units else 0.0
    n_words = len(words)
    lines = b"\n" + b
    stripped = text.strip()
    nl = stripped.find("\n")
    first = len(stripped) if nl < 0 else nl
    last = len(stripped) - stripped.rfind("\n") - 1
    n = max(len(clip), 1)
    cls = b.translate(_CLASSES)
    upper, lower_n, cjk = cls.count(b"u"), cls.count(b"l"), cls.count(b"j")
    letters = max(upper + lower_n, 1)
    return [
        len(text),
        n_words,
        text.count("\n"),
        len(_BULLET.findall(lines)),
        min(text.count("?"), 20),
        stripped.endswith("?"),
        bool(words) and words[0] in _QWORDS,
        cls.count(b"d"),
        upper / letters,
        cls.count(b"c") / n,
        (cls.count(b"n") + cjk) / n,
        cjk / n,
        min(text.count("```"), 10),
        len(_CODE_LINE.findall(lines)),
        (upper + lower_n) / n_words if n_words else 0.0,
        last,
        first,
        req > 0,
        req,
    ], mask


def lexical_cues(texts: Sequence[str]) -> np.ndarray:
    """(n, len(CUE_NAMES)) float64 matrix of hand cues, one row per text. Sizes use the whole
    text; pattern cues and character fractions its first 1,200 and last 600 characters."""
    clipped = [t if len(t) <= _CLIP_HEAD + _CLIP_TAIL else t[:_CLIP_HEAD] + "\n" + t[-_CLIP_TAIL:] for t in texts]
    rows, masks = zip(*[_text_cues(t, c) for t, c in zip(texts, clipped)]) if texts else ((), ())
    out = np.empty((len(texts), len(CUE_NAMES)))
    k = len(CUE_NAMES) - len(_FLAGS)
    out[:, :k] = np.array(rows, dtype=np.float64).reshape(len(texts), k)
    out[:, _LOG1P] = np.log1p(out[:, _LOG1P])
    out[:, k:] = (np.array(masks, dtype=np.uint64)[:, None] & _FLAG_BITS) != 0
    return out


# --- hashed n-grams -------------------------------------------------------------------------
_MIX1, _MIX2 = np.uint32(0x9E3779B1), np.uint32(0x85EBCA77)  # odd multiplicative-hash constants


class NgramHasher:
    """Hashed n-grams of o200k token ids (1..`order`-grams), fully vectorised.

    Texts are encoded as they are (case kept: measured as accurate as lower-casing, and the
    one encoding then also gives the exact token count, `encode`); BPE tokens are sub-word
    pieces, so unigrams act like word pieces / char n-grams and 2–3-grams like word n-grams.
    Only the first `head` and last `tail` tokens of each text are used (the ask is usually at
    one end; bounds the cost of long prompts). Each n-gram is hashed (multiply-xorshift on the
    id tuple) into `2**bits` columns; per-order blocks share the space. Counts are sublinear
    (log1p) and rows l2-normalised. CSR float32, no fitted state.
    """

    def __init__(self, bits: int = 18, order: int = 3, head: int = 384, tail: int = 128) -> None:
        if not 1 <= bits <= 24:
            raise ValueError(f"field 'bits' must be 1..24 (hashes are mixed in 32 bits), got {bits}")
        self.params = {"bits": bits, "order": order, "head": head, "tail": tail}
        self.n_features = 2**bits

    def __call__(self, texts: Sequence[str]):
        return self.from_ids(*encode(texts))

    def from_ids(self, ids: np.ndarray, off: np.ndarray):
        """The CSR matrix from `encode`'s output (one row per text). 32-bit arithmetic throughout
        (o200k ids < 2**18; hashes mixed in 32 bits, hence `bits` <= 24): half the memory
        traffic of 64-bit."""
        import scipy.sparse as sp

        order, head, tail = (self.params[k] for k in ("order", "head", "tail"))
        n = off.size - 1
        lens = np.diff(off).astype(np.int32)
        ids = ids.astype(np.uint32)
        row = np.repeat(np.arange(n, dtype=np.int32), lens)
        if lens.size and lens.max() > head + tail:  # read only the head and tail of long texts
            pos = np.arange(ids.size, dtype=np.int32) - off[:-1].astype(np.int32)[row]
            keep = (pos < head) | (pos >= (lens[row] - tail))
            ids, row = ids[keep], row[keep]
        mask = np.uint32(self.n_features - 1)
        cols, rows = [], []
        with np.errstate(over="ignore"):
            for k in range(order):
                if k == 0:
                    h = (ids + np.uint32(1)) * _MIX1
                    hk, rk = h, row
                else:
                    h = (h[:-1] ^ (ids[k:] + np.uint32(k + 1))) * _MIX2
                    same = row[k:] == row[:-k]
                    hk, rk = h[same], row[k:][same]
                cols.append((hk ^ (hk >> np.uint32(15))) & mask)
                rows.append(rk)
        # distinct (row, column) pairs and their counts, sorted: CSR in canonical form directly
        # (scipy's COO -> CSR conversion and sum_duplicates cost ~0.15 ms for one short text)
        key = np.concatenate(rows).astype(np.int64) * self.n_features + np.concatenate(cols)
        if n * self.n_features < 2**31:
            key = key.astype(np.int32)  # 32-bit keys sort ~2x faster
        key.sort()
        first = np.flatnonzero(np.diff(key, prepend=key[:1] - 1))  # empty when no text has a token
        counts = np.diff(np.append(first, key.size)).astype(np.float32)
        key = key[first]
        r = key >> self.params["bits"]
        indptr = np.searchsorted(r, np.arange(n + 1))
        data = np.log1p(counts)
        per_row = np.diff(indptr)
        norms = np.sqrt(np.bincount(r, data.astype(np.float64) ** 2, minlength=n))
        data /= np.repeat(np.where(per_row > 0, norms, 1.0), per_row).astype(np.float32)
        return sp.csr_matrix((data, key & (self.n_features - 1), indptr), shape=(n, self.n_features))


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


def same_family(model: str, fitted: str) -> bool:
    """True if the unseen `model` may borrow the fitted model's numbers: both parse to one named
    family. 'other' (a name no family matched) is no family: two such names are unrelated."""
    fam = model_family(model)
    return fam != len(FAMILIES) - 1 and model_family(fitted) == fam


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
