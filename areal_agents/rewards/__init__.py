r"""Reward functions usable inside and outside environments.

A reward is a plain callable ``reward(response, reference) -> RewardResult``; ``float(result)``
is the number and ``result.status`` says why (``correct``, ``wrong``, ``timeout``, ...). Slow
rewards also have ``await reward.acall(response, reference)``, run off the event loop with a
time limit. Rewards that parse model text (math, reasoning-gym, regular expressions) do it in
a grading process killed at the time limit (:mod:`areal_agents.rewards.isolation`).

What runs where, and with what rights
-------------------------------------
Three places run something that model text decides:

* **the caller** (the environment's process: a rollout worker, ``eval``, the env server):
  only linear-time text work on the answer (finding ``\boxed{}``, ``<answer>``, code fences;
  normalising; comparing strings) and ``ast.parse`` of submitted code (parsed, never
  compiled or run there); a grading worker's reply is unpickled with nothing but plain
  data, the reply classes and exception classes allowed. With the caller's full rights.
* **a grading worker** (:mod:`.isolation`, :mod:`._grader`, :mod:`._confine`): a fresh fork
  of a zygote for every grade, discarded after it, killed at the grade's ``timeout_s``.
  Before it reads its job it gives up: writing, creating, removing, renaming or changing any
  file; sockets; running programs; new processes and threads; signalling or tracing others
  (seccomp, ``RLIMIT_NPROC`` 0, ``RLIMIT_FSIZE`` 0); and, when the caller is root, root
  itself (a uid of its own, no capabilities, no new privileges). It keeps: reading the files
  its uid may read (all the caller's, when the caller is not root), 2 GiB of address space,
  64 descriptors, an empty directory it cannot write, ``PATH`` and the locale, but none of
  the caller's other variables (API keys included). Third-party scorers that evaluate text
  are guarded there (:mod:`._harden`): sympy's ``parse_expr``/``sympify`` accept plain
  mathematics only, and reasoning-gym's ``eval`` is ``literal_eval``, from the moment each
  module is imported.
* **the sandbox** (:mod:`areal_agents.sandboxes`): the submitted program itself. ``docker``:
  no network, uid 65534 without capabilities, read-only root, memory, pids and CPU limits;
  ``bubblewrap``: new namespaces (no network), read-only ``/usr``, rlimits, its own uid when
  the caller is root; ``process``: rlimits and a work directory only, which is not isolation.

The built-in rewards:

===============================  ========================================  =======================
Reward                           What it reads from the model's text       Where it runs
===============================  ========================================  =======================
``ExactMatch``, ``F1``           last ``<answer>``/``\boxed{}`` (or the    the caller
                                 text), normalised and compared as
                                 strings
the format checks                ``BoxedFormat``, ``AnswerTagFormat``,     the caller
                                 ``CodeBlockFormat``,
                                 ``ThinkAnswerFormat``: linear scans of
                                 the text
``RegexFormat``                  the text, matched by the (trusted)        a grading worker
                                 pattern
``MathEquivalence``              last ``\boxed{}``/``<answer>`` (at most   found in the caller,
                                 1000 characters): math-verify's LaTeX     parsed and compared in
                                 parser and sympy (guarded); each part of  a grading worker
                                 a hedge (``\lor``, ``5 = 6``) on its own
``ReasoningGymReward``           last ``<answer>``/``\boxed{}`` (or the    found in the caller,
                                 text), given to the dataset's own         scored in a grading
                                 ``score_answer`` (below)                  worker
``UnitTestReward``               a fenced Python block: ``ast.parse``\ d   the program: the
                                 for its names, run as a program; its      sandbox; the tests: a
                                 return values come back as plain values   grading worker; the
                                 (:mod:`._wire`) that the (trusted) tests  answer lines: read as
                                 check (:mod:`._judge`)                    text and JSON in the
                                                                           caller
``FunctionReward``               whatever the user's function reads        the caller, or a
                                                                           grading worker
                                                                           (``isolate=True``)
``LLMJudge``                     the answer, quoted under a nonce and      the caller (text only);
                                 sent to an OpenAI-compatible endpoint;    the endpoint
                                 only the strict ``SCORE:`` line of the
                                 reply is read
``WeightedSum``, ``FormatGate``  nothing of their own (their parts do)     the caller
===============================  ========================================  =======================

Reasoning-gym's datasets (every one ``MathPython-v0`` offers: ``datasets=`` takes any name of
``reasoning_gym.factory.DATASETS``), by what their scorer does with the answer. Each scores in
a grading worker, with ``verifier="reasoning_gym"``, or ``"auto"`` (the default) for a dataset
outside ``NUMERIC_DATASETS`` (math-verify grades theirs); the tasks themselves are generated in
the caller, by reasoning-gym's own code.

* sympy's ``parse_expr`` (an ``eval`` of Python it writes), guarded: ``countdown``,
  ``puzzle24``, ``simple_integration``, ``intermediate_integration``,
  ``polynomial_multiplication``.
* Python's ``eval`` of the answer once an exact match fails, guarded (literals and operators
  on them only): ``binary_matrix``, ``n_queens``, ``spiral_matrix``, ``string_insertion``.
* ``json.loads``, then a check or a simulation of the plan: ``boxnet``, ``codeio``,
  ``game_of_life``, ``graph_color``, ``group_anagrams``, ``jugs``, ``knight_swap``,
  ``number_sorting`` (its own stored answer through the guarded ``eval``),
  ``palindrome_partitioning``.
* numbers read with ``int``, ``float``, ``Decimal``, ``Fraction``, ``complex`` or
  ``numpy.loadtxt``: ``advanced_geometry``, ``bitwise_arithmetic`` (its own stored problem
  through the guarded ``eval``), ``calendar_arithmetic``, ``chain_sum``, ``coin_flip``,
  ``complex_arithmetic``, ``cryptarithm``, ``decimal_arithmetic``, ``decimal_chain_sum``,
  ``futoshiki``, ``gsm_symbolic``, ``kakurasu``, ``mini_sudoku``, ``number_format``,
  ``polynomial_equations``, ``pool_matrix``, ``power_function``, ``prime_factorization``,
  ``products``, ``rectangle_count``, ``sudoku``, ``survo``, ``time_intervals``.
* moves or a formula replayed by reasoning-gym's own engine: ``propositional_logic``,
  ``quantum_lock``, ``rubiks_cube``, ``rush_hour``, ``shortest_path``, ``sokoban``,
  ``tower_of_hanoi``, ``word_ladder``.
* text compared with the stored answer by the dataset's own rule (normalised, per
  character, word or cell, a board or assignment parser): ``ab``, ``arc_agi``,
  ``circuit_logic``, ``color_cube_rotation``, ``dice``, ``emoji_mystery``,
  ``family_relationships``, ``figlet_font``, ``fraction_simplification``,
  ``game_of_life_halting``, ``knights_knaves``, ``letter_jumble``, ``manipulate_matrix``,
  ``needle_haystack``, ``palindrome_generation``, ``path_star``, ``rearc``,
  ``self_reference``, ``sentence_reordering``, ``spell_backward``, ``tsumego``,
  ``word_sorting``, ``zebra_puzzles``.
* reasoning-gym's default (the stored answer, or its share of an answer that contains it):
  ``acre``, ``aiw``, ``arc_1d``, ``base_conversion``, ``basic_arithmetic``, ``bf``,
  ``binary_alternation``, ``caesar_cipher``, ``count_bits``, ``count_primes``,
  ``course_schedule``, ``gcd``, ``isomorphic_strings``, ``largest_island``, ``lcm``,
  ``leg_counting``, ``letter_counting``, ``list_functions``, ``mahjong_puzzle``, ``maze``,
  ``modulo_grid``, ``number_filtering``, ``number_sequence``, ``ransom_note``,
  ``rotate_matrix``, ``rotten_oranges``, ``simple_equations``, ``simple_geometry``,
  ``string_manipulation``, ``string_splitting``, ``string_synthesis``, ``syllogism``,
  ``word_sequence_reversal``.
* each member's scorer, as above: ``composite``.

``tests/rewards/test_rewards_audit.py`` keeps this list whole and its first two groups true
(every scorer that calls ``eval`` or ``parse_expr`` is in them); ``tests/rewards/
test_round3_host_eval.py`` feeds every dataset an answer that would run if evaluated.
"""

from areal_agents.rewards.base import (
    STATUSES,
    FunctionReward,
    Reward,
    RewardResult,
    RewardTimeout,
    call_with_timeout,
    check_timeout,
)
from areal_agents.rewards.code import (
    TestReport,
    UnitTestReward,
    UnitTests,
    assemble_program,
    run_unit_tests,
    select_code,
)
from areal_agents.rewards.compose import FormatGate, WeightedSum
from areal_agents.rewards.extract import (
    extract_answer,
    extract_answer_tag,
    extract_boxed,
    extract_code,
    extract_code_blocks,
)
from areal_agents.rewards.format import (
    AnswerTagFormat,
    BoxedFormat,
    CodeBlockFormat,
    FormatCheck,
    RegexFormat,
    ThinkAnswerFormat,
)
from areal_agents.rewards.isolation import (
    GraderPool,
    GraderUnavailable,
    GradingFailed,
    run_isolated,
)
from areal_agents.rewards.logic import (
    ReasoningGymReward,
    reasoning_gym_scorer,
    score_with_reasoning_gym,
)
from areal_agents.rewards.math import MathEquivalence, math_equal
from areal_agents.rewards.text import (
    F1,
    ExactMatch,
    exact_match,
    f1_score,
    gold_answers,
    normalize_answer,
)

__all__ = [
    "F1",
    "STATUSES",
    "AnswerTagFormat",
    "BoxedFormat",
    "CodeBlockFormat",
    "ExactMatch",
    "FormatCheck",
    "FormatGate",
    "FunctionReward",
    "GraderPool",
    "GraderUnavailable",
    "GradingFailed",
    "MathEquivalence",
    "ReasoningGymReward",
    "RegexFormat",
    "Reward",
    "RewardResult",
    "RewardTimeout",
    "TestReport",
    "ThinkAnswerFormat",
    "UnitTestReward",
    "UnitTests",
    "WeightedSum",
    "assemble_program",
    "call_with_timeout",
    "check_timeout",
    "exact_match",
    "extract_answer",
    "extract_answer_tag",
    "extract_boxed",
    "extract_code",
    "extract_code_blocks",
    "f1_score",
    "gold_answers",
    "math_equal",
    "normalize_answer",
    "reasoning_gym_scorer",
    "run_isolated",
    "run_unit_tests",
    "score_with_reasoning_gym",
    "select_code",
]
