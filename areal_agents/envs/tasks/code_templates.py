"""The procedural code task families: a function to write, its canonical body, its inputs.

Each :class:`CodeTemplate` draws constants (so that two tasks of one family usually need
different functions) and argument tuples; the expected outputs come from running the
canonical solution on the host. :data:`EASY_TEMPLATES` are one expression each;
:data:`MEDIUM_TEMPLATES` need a condition, a loop or an edge case.

>>> len(CODE_TEMPLATES) == len(EASY_TEMPLATES) + len(MEDIUM_TEMPLATES)
True
>>> sorted({t.level for t in CODE_TEMPLATES})
['easy', 'medium']
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CODE_TEMPLATES", "EASY_TEMPLATES", "MEDIUM_TEMPLATES", "CodeTemplate"]


@dataclass(frozen=True)
class CodeTemplate:
    """One family of function-writing tasks.

    ``describe`` and ``body`` are format strings over the constants that ``constants`` draws;
    ``inputs`` draws one argument tuple. The expected outputs come from running the canonical
    solution (our own code, on the host), so a template cannot state a wrong answer.
    """

    key: str
    name: str
    params: str
    describe: str
    body: str
    inputs: Callable[[random.Random], tuple[Any, ...]]
    constants: Callable[[random.Random], dict[str, Any]] = lambda rng: {}
    level: str = "easy"
    """``easy`` (one expression) or ``medium`` (a condition, a loop or an edge case)."""


def _ints(rng: random.Random, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(1, 6))]


def _word(rng: random.Random) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(rng.choice(letters) for _ in range(rng.randint(1, 7)))


def _maybe_palindrome(rng: random.Random) -> str:
    word = _word(rng)
    if rng.random() < 0.5:
        return word
    return word + word[::-1][rng.randint(0, 1) :]


def _sentence(rng: random.Random) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(1, 4)))


#: One-expression families.
EASY_TEMPLATES: tuple[CodeTemplate, ...] = (
    CodeTemplate(
        "add",
        "add",
        "a, b",
        "returns the sum of the integers `a` and `b`",
        "return a + b",
        lambda r: (r.randint(-50, 50), r.randint(-50, 50)),
    ),
    CodeTemplate(
        "subtract",
        "subtract",
        "a, b",
        "returns `a` minus `b`",
        "return a - b",
        lambda r: (r.randint(-50, 50), r.randint(-50, 50)),
    ),
    CodeTemplate(
        "multiply",
        "multiply",
        "a, b",
        "returns the product of the integers `a` and `b`",
        "return a * b",
        lambda r: (r.randint(-12, 12), r.randint(-12, 12)),
    ),
    CodeTemplate(
        "add_k",
        "add_{k}",
        "n",
        "returns `n` plus {k}",
        "return n + {k}",
        lambda r: (r.randint(-100, 100),),
        lambda r: {"k": r.randint(2, 20)},
    ),
    CodeTemplate(
        "max_list",
        "max_of_list",
        "xs",
        "returns the largest number in the non-empty list `xs`",
        "return max(xs)",
        lambda r: (_ints(r),),
    ),
    CodeTemplate(
        "min_list",
        "min_of_list",
        "xs",
        "returns the smallest number in the non-empty list `xs`",
        "return min(xs)",
        lambda r: (_ints(r),),
    ),
    CodeTemplate(
        "sum_list",
        "sum_list",
        "xs",
        "returns the sum of the numbers in the list `xs` (0 for an empty list)",
        "return sum(xs)",
        lambda r: (_ints(r) if r.random() < 0.9 else [],),
    ),
    CodeTemplate(
        "reverse",
        "reverse_string",
        "s",
        "returns the string `s` reversed",
        "return s[::-1]",
        lambda r: (_word(r),),
    ),
    CodeTemplate(
        "upper",
        "to_upper",
        "s",
        "returns the string `s` in upper case",
        "return s.upper()",
        lambda r: (_sentence(r),),
    ),
    CodeTemplate(
        "is_even",
        "is_even",
        "n",
        "returns True if the integer `n` is even and False otherwise",
        "return n % 2 == 0",
        lambda r: (r.randint(-30, 30),),
    ),
    CodeTemplate(
        "count_vowels",
        "count_vowels",
        "s",
        "returns how many vowels (a, e, i, o, u) the lower-case string `s` contains",
        "return sum(1 for c in s if c in 'aeiou')",
        lambda r: (_sentence(r),),
    ),
    CodeTemplate(
        "palindrome",
        "is_palindrome",
        "s",
        "returns True if the string `s` reads the same forwards and backwards",
        "return s == s[::-1]",
        lambda r: (_maybe_palindrome(r),),
    ),
    CodeTemplate(
        "square_all",
        "square_all",
        "xs",
        "returns a new list with the square of every number in `xs`",
        "return [x * x for x in xs]",
        lambda r: (_ints(r, -9, 9),),
    ),
    CodeTemplate(
        "greater_than",
        "greater_than_{k}",
        "xs",
        "returns the numbers in `xs` that are greater than {k}, in their original order",
        "return [x for x in xs if x > {k}]",
        lambda r: (_ints(r),),
        lambda r: {"k": r.randint(0, 10)},
    ),
    CodeTemplate(
        "repeat",
        "repeat_{k}",
        "s",
        "returns the string `s` repeated {k} times",
        "return s * {k}",
        lambda r: (_word(r),),
        lambda r: {"k": r.randint(2, 4)},
    ),
    CodeTemplate(
        "factorial",
        "factorial",
        "n",
        "returns n! (the factorial of the non-negative integer `n`; 0! is 1)",
        "result = 1\nfor i in range(2, n + 1):\n    result *= i\nreturn result",
        lambda r: (r.randint(0, 10),),
    ),
    CodeTemplate(
        "count_char",
        "count_char",
        "s, c",
        "returns how many times the character `c` occurs in the string `s`",
        "return s.count(c)",
        lambda r: (_sentence(r), r.choice("aeiost")),
    ),
    CodeTemplate(
        "last",
        "last_element",
        "xs",
        "returns the last element of the non-empty list `xs`",
        "return xs[-1]",
        lambda r: (_ints(r),),
    ),
)


def _pos_ints(rng: random.Random, lo: int = 1, hi: int = 60) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(1, 7))]


def _distinct_ints(rng: random.Random) -> list[int]:
    xs = _ints(rng)
    while len(set(xs)) < 2:
        xs.append(rng.randint(-20, 20))
    return xs


def _with_repeats(rng: random.Random) -> list[int]:
    pool = [rng.randint(-9, 9) for _ in range(rng.randint(1, 4))]
    return [rng.choice(pool) for _ in range(rng.randint(1, 8))]


def _range(rng: random.Random) -> dict[str, Any]:
    lo = rng.randint(-10, 5)
    return {"lo": lo, "hi": lo + rng.randint(3, 15)}


#: Harder families: several steps, a condition or an edge case, and constants that change the
#: function from one task to the next (a name alone does not give the answer away).
MEDIUM_TEMPLATES: tuple[CodeTemplate, ...] = (
    CodeTemplate(
        "count_greater",
        "count_greater_than_{k}",
        "xs",
        "returns how many numbers in the list `xs` are greater than {k}",
        "return sum(1 for x in xs if x > {k})",
        lambda r: (_ints(r),),
        lambda r: {"k": r.randint(0, 10)},
        level="medium",
    ),
    CodeTemplate(
        "divisible",
        "divisible_by_{k}",
        "xs",
        "returns the numbers in `xs` that are divisible by {k}, in their original order",
        "return [x for x in xs if x % {k} == 0]",
        lambda r: (_ints(r, -30, 30),),
        lambda r: {"k": r.randint(2, 7)},
        level="medium",
    ),
    CodeTemplate(
        "clamp",
        "clamp",
        "n",
        "returns `n` limited to the range from {lo} to {hi}: {lo} if `n` is smaller than {lo}, "
        "{hi} if it is larger than {hi}, otherwise `n` itself",
        "return max({lo}, min({hi}, n))",
        lambda r: (r.randint(-25, 25),),
        _range,
        level="medium",
    ),
    CodeTemplate(
        "between",
        "in_range",
        "xs",
        "returns the numbers in `xs` that are at least {lo} and at most {hi}, in their "
        "original order",
        "return [x for x in xs if {lo} <= x <= {hi}]",
        lambda r: (_ints(r),),
        _range,
        level="medium",
    ),
    CodeTemplate(
        "fizz",
        "fizz_buzz",
        "n",
        "returns 'Fizz' if the positive integer `n` is divisible by {a} but not by {b}, 'Buzz' "
        "if it is divisible by {b} but not by {a}, 'FizzBuzz' if it is divisible by both, and "
        "`n` as a string otherwise",
        "if n % {a} == 0 and n % {b} == 0:\n    return 'FizzBuzz'\nif n % {a} == 0:\n"
        "    return 'Fizz'\nif n % {b} == 0:\n    return 'Buzz'\nreturn str(n)",
        lambda r: (r.randint(1, 40),),
        lambda r: dict(zip("ab", r.sample([2, 3, 4, 5, 7], 2), strict=True)),
        level="medium",
    ),
    CodeTemplate(
        "scale_shift",
        "scale_and_shift",
        "xs",
        "returns a new list with every number `x` of `xs` replaced by `x * {k} + {b}`",
        "return [x * {k} + {b} for x in xs]",
        lambda r: (_ints(r, -9, 9),),
        lambda r: {"k": r.randint(2, 5), "b": r.randint(-6, 6)},
        level="medium",
    ),
    CodeTemplate(
        "power_sum",
        "power_sum",
        "xs",
        "returns the sum of `x ** {p}` over all numbers `x` in the list `xs` (0 for an empty list)",
        "return sum(x ** {p} for x in xs)",
        lambda r: (_ints(r, -6, 6) if r.random() < 0.9 else [],),
        lambda r: {"p": r.randint(2, 3)},
        level="medium",
    ),
    CodeTemplate(
        "second_largest",
        "second_largest",
        "xs",
        "returns the second largest distinct number in `xs` (the list holds at least two "
        "different numbers; repeated values count once)",
        "return sorted(set(xs))[-2]",
        lambda r: (_distinct_ints(r),),
        level="medium",
    ),
    CodeTemplate(
        "running_sum",
        "running_sum",
        "xs",
        "returns the list of running totals of `xs`: element i is the sum of xs[0] .. xs[i]",
        "total = 0\nout = []\nfor x in xs:\n    total += x\n    out.append(total)\nreturn out",
        lambda r: (_ints(r, -9, 9),),
        level="medium",
    ),
    CodeTemplate(
        "dedupe",
        "remove_duplicates",
        "xs",
        "returns the numbers of `xs` without repeats, keeping the first occurrence of each, in "
        "their original order",
        "out = []\nfor x in xs:\n    if x not in out:\n        out.append(x)\nreturn out",
        lambda r: (_with_repeats(r),),
        level="medium",
    ),
    CodeTemplate(
        "sum_digits",
        "digit_sum",
        "n",
        "returns the sum of the decimal digits of the non-negative integer `n`",
        "return sum(int(d) for d in str(n))",
        lambda r: (r.randint(0, 10 ** r.randint(1, 6)),),
        level="medium",
    ),
    CodeTemplate(
        "count_words",
        "count_words",
        "s",
        "returns how many words the string `s` holds (words are separated by single spaces; "
        "`s` is not empty)",
        "return len(s.split(' '))",
        lambda r: (_sentence(r),),
        level="medium",
    ),
    CodeTemplate(
        "remove_char",
        "remove_{c}",
        "s",
        "returns the string `s` with every '{c}' removed",
        "return s.replace('{c}', '')",
        lambda r: (_sentence(r),),
        lambda r: {"c": r.choice("aeiost")},
        level="medium",
    ),
    CodeTemplate(
        "capitalize",
        "capitalize_words",
        "s",
        "returns the lower-case sentence `s` with the first letter of every word in upper case",
        "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
        lambda r: (_sentence(r),),
        level="medium",
    ),
    CodeTemplate(
        "starts_with",
        "words_starting_with_{c}",
        "s",
        "returns the list of words of the sentence `s` that start with the letter '{c}', in "
        "their original order",
        "return [w for w in s.split(' ') if w.startswith('{c}')]",
        lambda r: (" ".join(r.choice([r.choice("abst") + _word(r), _word(r)]) for _ in range(4)),),
        lambda r: {"c": r.choice("abst")},
        level="medium",
    ),
    CodeTemplate(
        "longest_word",
        "longest_word",
        "s",
        "returns the longest word of the sentence `s` (the first one if several are equally long)",
        "return max(s.split(' '), key=len)",
        lambda r: (_sentence(r),),
        level="medium",
    ),
    CodeTemplate(
        "is_prime",
        "is_prime",
        "n",
        "returns True if the integer `n` is a prime number and False otherwise (numbers below 2 "
        "are not prime)",
        "if n < 2:\n    return False\nfor d in range(2, int(n ** 0.5) + 1):\n    if n % d == 0:\n"
        "        return False\nreturn True",
        lambda r: (r.randint(-3, 60),),
        level="medium",
    ),
    CodeTemplate(
        "gcd",
        "gcd",
        "a, b",
        "returns the greatest common divisor of the positive integers `a` and `b`",
        "while b:\n    a, b = b, a % b\nreturn a",
        lambda r: (r.randint(1, 60) * (k := r.randint(1, 6)), r.randint(1, 40) * k),
        level="medium",
    ),
    CodeTemplate(
        "fibonacci",
        "fibonacci",
        "n",
        "returns the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1",
        "a, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nreturn a",
        lambda r: (r.randint(0, 20),),
        level="medium",
    ),
    CodeTemplate(
        "index_of_max",
        "index_of_max",
        "xs",
        "returns the index of the largest number in the non-empty list `xs` (the first index "
        "if it occurs several times)",
        "return xs.index(max(xs))",
        lambda r: (_with_repeats(r),),
        level="medium",
    ),
    CodeTemplate(
        "alternating_sum",
        "alternating_sum",
        "xs",
        "returns xs[0] - xs[1] + xs[2] - xs[3] + ... (0 for an empty list)",
        "return sum(x if i % 2 == 0 else -x for i, x in enumerate(xs))",
        lambda r: (_ints(r, -9, 9) if r.random() < 0.9 else [],),
        level="medium",
    ),
    CodeTemplate(
        "count_evens",
        "count_multiples_of_{k}",
        "xs",
        "returns how many numbers in the list `xs` are multiples of {k}",
        "return sum(1 for x in xs if x % {k} == 0)",
        lambda r: (_ints(r, -30, 30),),
        lambda r: {"k": r.randint(2, 6)},
        level="medium",
    ),
    CodeTemplate(
        "digits",
        "digits_of",
        "n",
        "returns the list of the decimal digits of the non-negative integer `n`, most "
        "significant first",
        "return [int(d) for d in str(n)]",
        lambda r: (r.randint(0, 10 ** r.randint(1, 6)),),
        level="medium",
    ),
    CodeTemplate(
        "rotate",
        "rotate_left_{k}",
        "xs",
        "returns the list `xs` rotated left by {k} positions (the first {k} elements move to the "
        "end, wrapping around for short lists; an empty list stays empty)",
        "if not xs:\n    return []\nk = {k} % len(xs)\nreturn xs[k:] + xs[:k]",
        lambda r: (_ints(r, -9, 9) if r.random() < 0.9 else [],),
        lambda r: {"k": r.randint(1, 3)},
        level="medium",
    ),
)

#: Every family, easy first.
CODE_TEMPLATES: tuple[CodeTemplate, ...] = EASY_TEMPLATES + MEDIUM_TEMPLATES
