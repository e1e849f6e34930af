"""Structured output (`response_format` json_object / json_schema) and forced tool calls
(`tool_choice` "required" or a named function): grammar-constrained decoding with llguidance.

The protocol layer turns a request's schema into a grammar (`grammar_for`, checked there so a bad
schema is a 400 naming it); the engine gives each constrained sequence its own `Constraint`, a
matcher over the model's tokenizer. Before each sampling, the matcher's token mask goes onto that
sequence's row of logits (disallowed tokens -inf, ids past the tokenizer's vocabulary too, the end
tokens unless the grammar accepts what was written so far); the chosen token then advances it.
Nothing else about sampling changes, and rows without a constraint are never touched.

Compiled grammars are cached by grammar text (a small LRU): a matcher for a cached grammar is a
copy of the compiled one (`LLMatcher.deep_copy`), its lexer already built.

Library choice (measured on the demo model's tokenizer, 1874 tokens, a 4-field object schema,
one 40-token answer; 2 loaded cores): llguidance 1.9.1 compiles in 0.5-5 ms and fills a mask in
0.04 ms (median; 0.1-0.2 ms mean, the first mask of a new grammar up to ~7 ms), 0.12 ms with the
mask applied to the row; xgrammar 0.2.9 compiled in 13 ms and filled in 0.07 ms (mean), but its
wheel depends on triton (a GPU compiler) and apache-tvm-ffi. The tokenizer's llguidance form is
built once (60 ms); a matcher for a cached grammar is a 0.1 ms copy.
Both are far below a decode step; llguidance is one self-contained wheel, so it is the one used.
`llguidance.torch.apply_token_bitmask_inplace` is not used: it is a `torch.compile`d kernel whose
first call took seconds here; the mask is unpacked and applied with numpy (`unpackbits`, `where`),
single-threaded: torch's own ops on a row of the real vocabulary went to its thread pool and took
10-95 ms a row on a busy 2-core machine, numpy 0.15 ms (`bench --constraints`).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np
import torch

# Compact, deterministic layout (as `json.dumps` writes it): free whitespace would let a model
# write blanks until `max_tokens`, and no client needs it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_GRAMMARS = 32
# A client's schema is checked before llguidance sees it (`check_schema`), for what llguidance's own
# limits do not bound: its JSON compiler proves each intersection of `pattern`s non-empty with a
# budget of its own (a 1 KB `allOf` of 13 patterns took 3 s and 200 MB, 16 of them 30 s and 2 GB),
# and counts it expands (`minItems` 1000 took 3 s; a `{4294967295}` repetition compiles, then fails
# at the first token, mid-answer).
MAX_PATTERNS = 4  # `pattern`s one value must match at once (an `allOf`'s branches, followed through `$ref`)
MAX_REPEAT = 1000  # a counted repetition in a `pattern` ({n}, {n,m})
MAX_PATTERN_SIZE = 10_000  # a pattern's size with its counted repetitions expanded
MAX_ITEMS = 100  # `minItems`, `minProperties`, `minContains`: each is expanded into the grammar
MAX_COUNT = 100_000  # `maxItems`, `minLength`, `maxLength`, ...: bounds no answer comes near
_COUNTS = {"minItems": MAX_ITEMS, "minProperties": MAX_ITEMS, "minContains": MAX_ITEMS, "maxItems": MAX_COUNT,
           "maxProperties": MAX_COUNT, "maxContains": MAX_COUNT, "minLength": MAX_COUNT, "maxLength": MAX_COUNT}


def _limits():
    """llguidance's own bounds on a grammar, tighter than its defaults where a client's grammar
    could otherwise hold a worker: the grammar's size and its lexer's states (memory, 1-2 kB each)
    and fuel (CPU, ~50k a ms), and short error messages (no parser state, no grammar)."""
    import llguidance

    return llguidance.LLParserLimits(max_grammar_size=100_000, max_lexer_states=50_000,
                                     initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
                                     step_max_items=50_000, verbose_errors=False)


class GrammarError(ValueError):
    """A schema llguidance cannot turn into a grammar (invalid, or a feature it does not support)."""


@lru_cache(maxsize=CACHE_GRAMMARS)
def _grammar(kind: str, schema_json: str) -> str:
    import llguidance

    schema = {"type": "object"} if kind == "json_object" else json.loads(schema_json)
    check_schema(schema)
    return _compiled(lambda: llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS),  # type: ignore[arg-type]
                     "the schema cannot be compiled")


@lru_cache(maxsize=CACHE_GRAMMARS)
def _lark(text: str) -> str:
    import llguidance

    return _compiled(lambda: llguidance.LLMatcher.grammar_from_lark(text), "the grammar cannot be compiled")


def _compiled(make, otherwise: str) -> str:
    """The grammar ``make()`` builds, validated; `GrammarError` with llguidance's first reason (or
    ``otherwise``) when it cannot be built or would not compile."""
    import llguidance

    try:
        grammar = make()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, limits=_limits())
    except Exception as exc:  # noqa: BLE001 - whatever a client's grammar makes the compiler raise is a 400
        raise GrammarError(str(exc) or otherwise) from None
    if is_error:
        raise GrammarError(messages[0] if messages else otherwise)
    return grammar


def tool_grammar(functions: list[tuple[str, dict | None]], parallel: bool = True) -> str:
    """The grammar of an answer that is only calls of `functions` (`toolcalls.grammar`); raises
    `GrammarError` when a function's parameters schema cannot be compiled."""
    from .toolcalls import grammar

    for _, params in functions:
        if params:
            check_schema(params)
    return _lark(grammar(functions, parallel))


def grammar_for(kind: str, schema: dict | None = None) -> str:
    """The grammar of a `json_object` (any JSON object) or of a `json_schema` request; raises
    `GrammarError` with llguidance's reason for a schema it cannot compile."""
    return _grammar(kind, json.dumps(schema, separators=(",", ":")) if schema is not None else "")  # key order is meaningful


def check_schema(schema) -> None:
    """Refuses (`GrammarError`) a schema whose compilation or use llguidance does not bound well:
    counts past `_COUNTS`, patterns past `MAX_REPEAT` / `MAX_PATTERN_SIZE`, more than
    `MAX_PATTERNS` patterns intersected, and references that can never produce a value (a `$ref`
    cycle, `{"$ref": "#"}`, a required property that is the object again). A reference it cannot
    resolve is left to llguidance, which names it."""
    nodes = _walk(schema)
    for node in nodes:
        for key, bound in _COUNTS.items():
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > bound:
                raise GrammarError(f"`{key}` {value} is more than this server allows ({bound})")
        if isinstance(node.get("pattern"), str):
            _check_pattern(node["pattern"])
        if isinstance(node.get("allOf"), list):
            n = _patterns(schema, node, set())
            if n > MAX_PATTERNS:
                raise GrammarError(f"an `allOf` intersects {n} patterns; at most {MAX_PATTERNS} are allowed")
    if isinstance(schema, dict) and not _productive(schema):
        raise GrammarError("the schema's references never end (a `$ref` cycle, or a value that must contain "
                           "itself): no JSON value matches it")


_VALUES = ("const", "enum", "default", "examples")  # JSON values, not schemas


def _walk(schema) -> list[dict]:
    """Every schema object in `schema` (depth-first, iterative: the body's nesting is bounded
    before this, but not by this)."""
    out, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            out.append(node)
            stack.extend(v for k, v in node.items() if k not in _VALUES)
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _check_pattern(pattern: str) -> None:
    import re._parser as sre  # Python's own regex parser

    counts = [int(c) for m in re.finditer(r"\{(\d+)(?:,(\d*))?\}", pattern) for c in m.groups() if c]
    if counts and max(counts) > MAX_REPEAT:
        raise GrammarError(f"a pattern repeats {max(counts)} times; at most {MAX_REPEAT} are allowed")
    try:
        parsed = sre.parse(pattern)
    except Exception:  # noqa: BLE001 - a syntax Python's parser does not know: llguidance decides
        return
    if _size(parsed) > MAX_PATTERN_SIZE:
        raise GrammarError(f"a pattern is larger than {MAX_PATTERN_SIZE} characters with its repetitions expanded")


def _size(parsed) -> int:
    """A parsed regex's size with counted repetitions expanded (an unbounded one counted once)."""
    import re._constants as c

    total = 0
    for op, arg in parsed:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            lo, hi, sub = arg
            total += _size(sub) * max(1, lo, 0 if hi == c.MAXREPEAT else hi)
        elif op == c.SUBPATTERN:
            total += _size(arg[-1])
        elif op == c.BRANCH:
            total += sum(_size(b) for b in arg[1])
        elif op in (c.ASSERT, c.ASSERT_NOT):
            total += _size(arg[1])
        else:
            total += 1
        if total > MAX_PATTERN_SIZE:
            break
    return total


def _resolve(root, ref):
    """The node a local `$ref` ("#", "#/$defs/a", ...) points at in `root`, or None."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _patterns(root, node, seen: set) -> int:
    """The patterns a value matching `node` must match at once: its own, its `allOf` branches' and
    those of the references it makes (each node counted once)."""
    if not isinstance(node, dict) or id(node) in seen:
        return 0
    seen.add(id(node))
    n = 1 if isinstance(node.get("pattern"), str) else 0
    branches = node.get("allOf")
    for sub in branches if isinstance(branches, list) else []:
        n += _patterns(root, sub, seen)
    if "$ref" in node:
        n += _patterns(root, _resolve(root, node["$ref"]), seen)
    return n


def _productive(root) -> bool:
    """Whether some finite JSON value matches `root`, as far as its references decide it: a least
    fixpoint over the schema's nodes (a node reached only through itself is not productive). What
    this does not model (`not`, `if`, ...) counts as productive: llguidance decides those."""
    nodes = _walk(root)
    good: set[int] = set()

    def ok(node) -> bool:
        if isinstance(node, bool) or not isinstance(node, dict):
            return node is not False
        if id(node) not in ids:
            return True
        return id(node) in good

    def now(node: dict) -> bool:
        if "$ref" in node:
            target = _resolve(root, node["$ref"])
            if target is not None and not ok(target):
                return False
        for key in ("allOf",):
            if isinstance(node.get(key), list) and not all(ok(s) for s in node[key]):
                return False
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key] and not any(ok(s) for s in node[key]):
                return False
        props, required = node.get("properties"), node.get("required")
        props = props if isinstance(props, dict) else {}
        required = required if isinstance(required, list) else []
        if any(not ok(props[k]) for k in required if isinstance(k, str) and k in props):
            return False
        items = node.get("items")
        least = node.get("minItems", 0)
        if isinstance(least, int) and least > 0 and isinstance(items, dict) and not ok(items):
            return False
        prefix = node.get("prefixItems")
        if isinstance(prefix, list) and isinstance(least, int) and not all(ok(s) for s in prefix[:least]):
            return False
        return True

    ids = {id(n) for n in nodes}
    changed = True
    while changed:
        changed = False
        for node in nodes:
            if id(node) not in good and now(node):
                good.add(id(node))
                changed = True
    return ok(root)


def _message(text: str) -> str:
    """llguidance's reason without its internal layers (the first line says what is wrong; a
    Lark grammar's position prefix is dropped)."""
    line = text.strip().splitlines()[0] if text.strip() else "the schema cannot be compiled"
    from ...errors import brief

    return brief(re.sub(r"^at \d+\(\d+\): ", "", line), 200, quote=False)


def explain(exc: GrammarError) -> str:
    return _message(str(exc))


class Grammars:
    """One per service: the tokenizer in llguidance's form and compiled matchers by grammar, least
    recently used evicted. The tokenizer's form is built here, with the service (in Gunicorn's
    master, before the fork): for the real vocabulary it takes seconds, which the first
    constrained request would otherwise wait."""

    def __init__(self, tokenizer, eos_ids, size: int = CACHE_GRAMMARS):
        self.tokenizer = tokenizer
        self.eos_ids = sorted(int(e) for e in eos_ids)
        self.size = size
        self._llt = None
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        _ = self.llt

    @property
    def llt(self):
        if self._llt is None:
            import llguidance.hf

            self._llt = llguidance.hf.from_tokenizer(self.tokenizer)
        return self._llt

    def matcher(self, grammar: str):
        import llguidance

        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                self.hits += 1
                return compiled.deep_copy()  # type: ignore[attr-defined]
            self.misses += 1
        try:
            compiled = llguidance.LLMatcher(self.llt, grammar, log_level=0, limits=_limits())
            if not compiled.is_error():
                _first_mask(compiled, self.llt.vocab_size)
        except Exception as exc:  # noqa: BLE001 - a client's grammar: never the server's fault
            raise GrammarError(str(exc) or "the grammar cannot be compiled") from None
        if compiled.is_error():
            raise GrammarError(compiled.get_error())
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > self.size:
                self._compiled.popitem(last=False)
        return compiled.deep_copy()

    def constraint(self, grammar: str) -> Constraint:
        return Constraint(self.matcher(grammar), self.llt.vocab_size, self.eos_ids, param_of(grammar))

    def stats(self) -> dict:
        return {"entries": len(self._compiled), "hits": self.hits, "misses": self.misses}


def _first_mask(matcher, vocab_size: int) -> None:
    """Computes the compiled matcher's first mask (its state is unchanged; copies start from it), so
    a grammar that allows nothing at all (a `$ref` cycle llguidance accepts, a regex it cannot
    decide) is refused with the request, not found at the first token."""
    bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    if not matcher.is_error() and not bits.any() and not matcher.is_accepting():
        raise GrammarError("no JSON value matches the schema")


def param_of(grammar: str) -> str:
    """The request field a grammar came from: forced tool calls (`toolcalls.grammar`) or `response_format`."""
    return "tools" if grammar.startswith("start: call") else "response_format"


class Constraint:
    """One sequence's matcher: masks its row of logits, advances with the chosen token. A matcher
    that fails mid-answer (a limit of llguidance's reached: the client's grammar is too complex) is
    the client's error (`InvalidRequest`, 400 naming `param`), never the server's."""

    def __init__(self, matcher, vocab_size: int, eos_ids: list[int], param: str = "response_format"):
        self.param = param
        self.m = matcher
        self.vocab = vocab_size
        self.eos = torch.tensor(eos_ids, dtype=torch.long)
        self.eos_ids = np.asarray(eos_ids, dtype=np.int64)
        self.bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self.mask_s = 0.0  # time spent computing and applying masks (seconds)
        self.steps = 0

    def copy(self) -> Constraint:
        """A matcher of its own in this one's state (a request's other choices)."""
        return Constraint(self.m.deep_copy(), self.vocab, self.eos_ids.tolist(), self.param)

    @property
    def accepting(self) -> bool:
        return bool(self.m.is_accepting())

    def allowed(self, n: int) -> torch.Tensor:
        """A bool row of `n` ids: the tokens the grammar allows next (the end tokens exactly when it
        accepts); ids the tokenizer does not have are never allowed."""
        return torch.from_numpy(self._allowed(n))

    def _allowed(self, n: int) -> np.ndarray:
        self.m.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
        if self.m.is_error():
            raise self._failed()
        ok = np.zeros(n, dtype=np.bool_)
        k = min(n, self.vocab)
        ok[:k] = np.unpackbits(self.bits.view(np.uint8), count=k, bitorder="little").view(np.bool_)
        ok[self.eos_ids[self.eos_ids < n]] = self.accepting
        return ok

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A masked copy of one row of logits. numpy, not torch: on a row this size torch's ops go
        to its thread pool, whose hand-offs cost more than the work (up to 90 ms a row on a busy
        2-core machine, against 0.3 ms here)."""
        import time

        t = time.perf_counter()
        ok = self._allowed(logits.shape[-1])
        if not ok.any():
            raise self._failed("the grammar allows no token of this vocabulary")
        row = logits.detach().to(torch.float32).numpy()
        out = torch.from_numpy(np.where(ok, row, np.float32(-np.inf))).to(logits.dtype)
        self.mask_s += time.perf_counter() - t
        self.steps += 1
        return out

    def must_end(self) -> bool:
        """The grammar is complete: only an end token may follow."""
        return bool(self.m.is_stopped())

    def advance(self, token: int) -> None:
        if int(token) in self.eos.tolist():
            return
        if not self.m.consume_token(int(token)):
            raise self._failed()

    def _failed(self, why: str = ""):
        from ...errors import InvalidRequest

        return InvalidRequest(f"`{self.param}` cannot be followed: the grammar compiler gave up on it "
                              f"({why or _message(self.m.get_error())})", param=self.param, code="invalid_schema")
