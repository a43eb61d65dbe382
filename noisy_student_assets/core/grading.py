"""Answer extraction and verifiable rewards: is a model's final answer mathematically the gold one?

Extraction is plain linear-time string work in this process.  Equivalence is math-verify
(``verify(parse(gold), parse(answer))``, gold first: verify is not symmetric) in a helper process,
bounded by the CPU time the check spends rather than by wall time, so that a loaded machine grades as
an idle one; it never hangs or raises, in any thread or process; see ``_math_verify_worker``.  The
first check in a process pays the helper's startup.

A check has three outcomes (a ``Verdict``): True, False, or None - *ungraded* - when it could not
finish (it ran out of CPU time, or its helper died or hung, twice).  Ungraded is not wrong: callers
count it apart.  Only True and False are cached; an ungraded check is tried afresh the next time.
"""

import re
from functools import lru_cache
from typing import TypeAlias

from noisy_student_assets.core._math_verify_worker import MathVerifyWorker

TIMEOUT_S = 2.0
"""Default bound, in CPU seconds of the helper, on one equivalence check; past it the check is retried once on
a fresh helper, then ungraded."""

MAX_ANSWER_CHARS = 1000
"""Longer answers are rejected unchecked: no real answer is this long, and parsing would be slow."""

MAX_NESTING = 8
"""Deeper bracket nesting is rejected unchecked: math-verify's parse time grows with nesting (about 0.1 CPU s a
level here), and at 20 levels one check outran TIMEOUT_S on a loaded CI machine. MATH-500's answers nest 2 deep."""

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_GOLD_MARKERS = ("####", "<answer>", *_BOX_COMMANDS)
_BOX_ARGUMENT = re.compile(r"[ \t]*(?:(?P<brace>\{)|(?P<unbraced>[^\s${}]+))")  # "\boxed{5}", "\boxed 5"
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)  # escaped \{ \} are not grouping braces
_LEADING_JUNK = " \t\r\n$"
_TRAILING_JUNK = _LEADING_JUNK + "."
_GSM8K_ANSWER = re.compile(r"####[ \t]*([^\n]*)")
# Integers, thousands separators, decimals, simple fractions; the look-behind keeps "5-3" from
# reading as -3 and "x2" or "1.5.3" from yielding a number.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_OPENERS, _CLOSERS = frozenset("{(["), frozenset("})]")
# A final numeric answer, once `_bare` has dropped its decorations.
_NUMBER_FORM = re.compile(r"-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")  # ".35625" is a MATH-500 gold
_FRACTION_FORM = re.compile(
    r"-?(?:\d+/\d+|\d*\\[dt]?frac(?:\{-?\d+\}\{\d+\}|\d\d))"
)  # "7/2", "\frac{7}{2}", "3\frac12"
# Decorations, dropped in this order by `_normalized`: a numeral in a font ("\textbf{18}"); a unit, which has a
# letter and at most a one-digit power ("\text{ dollars}", "\mbox{ inches}^2", "{\rm cm}^{2}"); then degrees,
# percent, dollars, a base's subscript ("52_8": math-verify ignores it), LaTeX spacing, \left, \right, \mathbin and
# whitespace.
_FONT = re.compile(r"\\(?:text|textrm|textbf|mathrm|mathbf|boldsymbol|mbox)\{([-+.,\d\s]*)\}")
_UNIT = re.compile(
    r"(?:\\(?:text|textrm|textbf|textit|mathrm|mbox|operatorname)\{\s*[A-Za-z][^{}]*\}|\{\\rm\s*[A-Za-z][^{}]*\})"
    r"(?:\^(?:\{\\text\{\d\}\}|\{\d\}|\d))?"
)
_DECORATION = re.compile(
    r"\^\{?\\circ\}?|\\circ|°|\\?%|\\\$|_(?:\{\d+\}|\d+)|\\[,;:! ]|\\q?quad|\\left|\\right|\\mathbin|\{,\}|~|\s"
)
_NAMED = re.compile(r"(?:[A-Za-z]\w*)?=")  # "x=5", and "=18" left of "\text{Total} = 18"
_TRAILING_WORDS = re.compile(r"[A-Za-z]+(?:\^\d)?$")  # "18 dollars", "5 cm^2" (spaces already dropped)
# Arithmetic on numbers alone, once `_normalized` has run and its operators and fractions are rewritten below:
# a binary + - * after a number or a bracket, or a product written by juxtaposition ("60(55)", "(60)(55)").
_OPERATOR = re.compile(r"\\times|\\cdot|\\div|\\ast|[*×÷⋅∗·:]")
_BRACED_FRACTION = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_LITERAL = re.compile(r"[-+*/^().,\d]+")
_BINARY = re.compile(r"[\d)][-+*]|\d\(|\)[\d(]")

Verdict: TypeAlias = bool | None
"""An equivalence check's outcome: True, False, or None when it is ungraded (see the module docstring)."""

_worker = MathVerifyWorker()


def extract_answer(response: str) -> str | None:
    """The final answer stated in a model response or a reference solution, or None.

    In order of precedence: the last r1-zero ``<answer>...</answer>`` (the closing tag may be
    missing, as stop strings are cut from generations; a ``\\boxed{}`` inside it wins), the last
    ``\\boxed{...}`` / ``\\boxed x`` / ``\\fbox{...}``, the rest of the last GSM8K ``#### ...``
    line, and finally the last plain number in the text (thousands separators dropped).
    Surrounding whitespace, ``$`` delimiters and trailing periods are stripped.
    """
    if not isinstance(response, str):
        return None
    explicit = _explicit_answer(response)
    if explicit is not None:
        return explicit
    numbers = _NUMBER.findall(response)
    return numbers[-1].replace(",", "") if numbers else None


def grade(response: str, gold: str, *, timeout_s: float | None = None) -> Verdict:
    """Whether the answer extracted from ``response`` is mathematically equivalent to ``gold``.

    A gold carrying a ``####``, ``\\boxed`` or ``<answer>`` marker (a full reference solution) is
    reduced to its extracted answer first; otherwise it is used as is.  Never raises; False when
    either side is missing or too large, None (ungraded) when the check does not finish in
    ``timeout_s`` CPU seconds (default ``TIMEOUT_S``), twice.
    """
    if not isinstance(gold, str):
        return False
    if any(marker in gold for marker in _GOLD_MARKERS):
        gold = extract_answer(gold)
    return answers_equivalent(gold, extract_answer(response), timeout_s=timeout_s)


def answers_equivalent(gold: str | None, answer: str | None, *, timeout_s: float | None = None) -> Verdict:
    """Whether two extracted answers are mathematically equivalent, ``gold`` as math-verify's gold.

    Never raises or hangs: False for missing, empty, over-long or over-nested strings, and for a number
    against an arithmetic expression still to be evaluated (see ``unevaluated``); None
    (ungraded) for checks that do not finish in ``timeout_s`` CPU seconds (default ``TIMEOUT_S``),
    twice.
    """
    if not (isinstance(gold, str) and isinstance(answer, str)):
        return False
    gold, answer = _checkable(gold), _checkable(answer)
    if not (gold and answer) or unevaluated(gold, answer) or unevaluated(answer, gold):
        return False
    return _equivalent(gold, answer, TIMEOUT_S if timeout_s is None else timeout_s)


def unevaluated(reference: str | None, answer: str | None) -> bool:
    """True when ``reference`` is a plain number and ``answer`` is not a number in a final form.

    math-verify evaluates expressions, so it grades ``60 * 55`` equal to 3300: a policy rewarded by it learns to
    restate the question instead of answering it (the products task's seed 1 did, docs/results.md).  Against a
    plain number, so, only a number is an answer: with its decorations dropped (``x =``, a leading ``+``, thousands
    separators, ``\\$``, ``\\%``, degrees, a font, units such as ``\\text{ cm}^2``, LaTeX spacing, trailing words,
    one pair of brackets), it must be a decimal numeral, or against a non-integer a fraction (``7/2``,
    ``\\frac{7}{2}``).  Everything else is refused unparsed: ``60 \\times 55``, ``120/2`` against 60,
    ``\\sqrt{3600}``, ``5!``, ``55\\text{}^{2}``, ``1.2e6`` and ``60 * 55 = 3300`` (the box holds the answer, not
    the working).
    """
    reference, answer = _checkable(reference or ""), _checkable(answer or "")
    if not (reference and answer and _NUMBER_FORM.fullmatch(reference)):
        return False
    form = _bare(answer)
    if _NUMBER_FORM.fullmatch(form):
        return False
    return float(reference.replace(",", "")).is_integer() or not _FRACTION_FORM.fullmatch(form)


def _normalized(answer: str) -> str:
    """``answer`` without the decorations that leave its value alone (see ``_DECORATION``), a unicode minus as ``-``."""
    return _DECORATION.sub("", _UNIT.sub("", _FONT.sub(r"\1", answer))).replace("−", "-")


def _bare(answer: str) -> str:
    """The normalized answer without a name (``x =``), trailing words, a leading ``+`` and one pair of brackets."""
    form = _normalized(answer)
    form = _TRAILING_WORDS.sub("", form.removeprefix(match.group()) if (match := _NAMED.match(form)) else form)
    if form[:1] + form[-1:] in ("{}", "()"):
        form = form[1:-1]
    return form.removeprefix("+")


def is_literal_arithmetic(answer: str | None) -> bool:
    """Whether ``answer`` is arithmetic on numbers alone ("60 * 55", "7 - 2 + 9", "60(55)",
    "\\frac{1}{2} + \\frac{1}{4}"): a question restated, which no question has as its final answer.  A number, a
    fraction, a power or a tuple ("-3", "3/4", "2^{10}", "(3,-4)") is not; a range written "1-2" counts as arithmetic.
    """
    if not isinstance(answer, str):
        return False
    form = _normalized(_checkable(answer) or "")  # plain words stay: "3 + 2i" is a number
    # A fraction becomes a/b without brackets: a mixed number ("1\frac{4}{5}") is no product.
    form = _BRACED_FRACTION.sub(r"\1/\2", _OPERATOR.sub("*", form)).replace("{", "").replace("}", "")
    return _LITERAL.fullmatch(form) is not None and _BINARY.search(form) is not None


def is_gradable(answer: str | None, *, timeout_s: float | None = None) -> Verdict:
    """True iff ``answer`` can be an answer at all: math-verify can check it (it is equivalent to itself), and it
    is not a question restated (``is_literal_arithmetic``), which would otherwise win a vote and become a label.

    False for None, empty, over-long, over-nested, unparseable or literal-arithmetic answers; None when the
    self-check is ungraded.
    """
    if is_literal_arithmetic(answer):
        return False
    return answers_equivalent(answer, answer, timeout_s=timeout_s)


def format_reward(response: str) -> float:
    """1.0 when the response marks its final answer explicitly (``\\boxed``, ``<answer>`` or
    ``####``) and the marker holds a non-empty answer, else 0.0; independent of correctness."""
    return float(isinstance(response, str) and _explicit_answer(response) is not None)


def answer_reward(response: str, gold: str) -> float | None:
    """1.0 when ``grade(response, gold)``, 0.0 when not, None when it is ungraded (no reward signal)."""
    verdict = grade(response, gold)
    return None if verdict is None else float(verdict)


def _explicit_answer(text: str) -> str | None:
    """The answer under an explicit marker (``<answer>``, ``\\boxed``, ``####``), or None."""
    tag = text.rfind("<answer>")
    if tag >= 0:
        start = tag + len("<answer>")
        end = text.find("</answer>", start)
        content = text[start:] if end < 0 else text[start:end]
        boxed = _last_boxed(content)
        return _strip_delimiters(content if boxed is None else boxed)
    boxed = _last_boxed(text)
    if boxed is not None:
        return _strip_delimiters(boxed)
    lines = _GSM8K_ANSWER.findall(text)
    return _strip_delimiters(lines[-1]) if lines else None


def _last_boxed(text: str) -> str | None:
    """Argument of the last ``\\boxed``/``\\fbox``, braces matched; None if absent or unclosed."""
    command = max(_BOX_COMMANDS, key=text.rfind)
    start = text.rfind(command)
    if start < 0:
        return None
    argument = _BOX_ARGUMENT.match(text, start + len(command))
    if argument is None:
        return None
    if argument.group("unbraced"):
        return argument.group("unbraced")
    depth = 0
    for token in _BRACE_OR_ESCAPE.finditer(text, argument.start("brace")):
        if token.group() == "{":
            depth += 1
        elif token.group() == "}":
            depth -= 1
            if depth == 0:
                return text[argument.end("brace") : token.start()]
    return None


def _strip_delimiters(answer: str) -> str | None:
    # str.strip, not a regex: an anchored "[...]+$" pattern is quadratic on long whitespace runs.
    return answer.rstrip(_TRAILING_JUNK).lstrip(_LEADING_JUNK) or None


def _checkable(answer: str) -> str | None:
    """The answer as sent to math-verify (wrapped there in ``$...$``), or None to reject it."""
    # Inner "$" would end the math-mode wrapper, and "\$" is a currency sign, not math.
    answer = answer.replace("\\$", "").replace("$", "").strip()
    if len(answer) > MAX_ANSWER_CHARS or _nesting_depth(answer) > MAX_NESTING:
        return None
    return answer


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif char in _CLOSERS:
            depth -= 1
    return deepest


def clear_cache() -> None:
    """Forget cached equivalence results, so the next checks are timed cold (the benchmark)."""
    _verdict.cache_clear()


class _Ungraded(Exception):
    """Raised through ``_verdict``'s cache, which keeps only returned values."""


def _equivalent(gold: str, answer: str, timeout_s: float) -> Verdict:
    try:
        return _verdict(gold, answer, timeout_s)
    except _Ungraded:
        return None


@lru_cache(maxsize=16384)
def _verdict(gold: str, answer: str, timeout_s: float) -> bool:
    # Cached: samples repeat answers.  An unfinished check is not a verdict, so it raises past the cache.
    verdict = _worker.equivalent(gold, answer, timeout_s)
    if verdict is None:
        raise _Ungraded
    return verdict
