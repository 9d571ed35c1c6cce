"""Programming problems with tests the sandbox runs: the record every code recipe reads.

A problem file is JSONL (or parquet) with one object per problem in this layout:

    {"id": "minicode/17", "question": "...", "test_kind": "assert",
     "tests": ["assert f(2) == 8", ...], "entry_point": "f",
     "starter_code": "", "solutions": ["def f(x):\\n    return x * 3 + 2\\n"]}

``test_kind`` is one of the sandbox's job kinds and ``tests`` is in that kind's format
(``fastcrit.sandbox.Job``): ``assert`` = Python sources; ``stdio`` = ``{"input", "output"}``;
``call`` = ``{"args", "kwargs", "expected"}`` for ``entry_point`` (a function, or a method of class
``Solution``). Public formats (HumanEval, MBPP, APPS / TACO, CodeContests, LiveCodeBench) are turned
into this record by ``fastcrit.data.formats``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from fastcrit.data.text_checks import SURROGATE_WHY, lone_surrogate
from fastcrit.sandbox import Job, JobError
from fastcrit.sandbox.types import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S

TEST_KINDS = ("assert", "stdio", "call")


class ProblemError(ValueError):
    """A problem record that cannot be used; the message names the field."""


@dataclass
class Problem:
    id: str
    question: str  # the statement shown to the model
    test_kind: str  # "assert" | "stdio" | "call"
    tests: list  # in the sandbox's format for ``test_kind``
    entry_point: str | None = None  # function (or Solution method) the tests call
    starter_code: str = ""  # code an answer completes (HumanEval's prompt, LiveCodeBench's stub)
    solutions: list[str] = field(default_factory=list)  # reference solutions, when known
    source: str = ""  # where it came from, e.g. "humaneval", "taco", "minicode"
    prelude: str = ""  # code run before every program (the imports APPS / TACO / LiveCodeBench give)
    meta: dict = field(default_factory=dict)  # anything else worth keeping (difficulty, tags)

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ProblemError(f"'id' must be a non-empty string, got {self.id!r}")
        if not isinstance(self.question, str) or not self.question.strip():
            raise ProblemError(f"{self.id}: 'question' must be a non-empty string")
        if self.test_kind not in TEST_KINDS:
            raise ProblemError(f"{self.id}: 'test_kind' must be one of {TEST_KINDS}, got {self.test_kind!r}")
        if not isinstance(self.tests, list) or not self.tests:
            raise ProblemError(f"{self.id}: 'tests' must be a non-empty list")
        if not isinstance(self.solutions, list) or not all(isinstance(s, str) for s in self.solutions):
            raise ProblemError(f"{self.id}: 'solutions' must be a list of strings")
        if not isinstance(self.starter_code, str) or not isinstance(self.prelude, str):
            raise ProblemError(f"{self.id}: 'starter_code' and 'prelude' must be strings")
        if not isinstance(self.meta, dict):  # `data prepare` and the recipes call meta.get
            raise ProblemError(f"{self.id}: 'meta' must be an object, got {type(self.meta).__name__}")
        if lone_surrogate(self.id):
            raise ProblemError(f"'id' {self.id!a}: {SURROGATE_WHY}")
        texts = {"question": self.question, "starter_code": self.starter_code, "prelude": self.prelude}
        for name, value in {**texts, "solutions": self.solutions, "tests": self.tests}.items():
            if lone_surrogate(value):
                raise ProblemError(f"{self.id}: '{name}': {SURROGATE_WHY}")
        try:  # the sandbox's own validation normalises the tests (and names a bad one)
            self.tests = self.job("").tests
        except JobError as e:
            raise ProblemError(f"{self.id}: {e}") from None

    def job(
        self,
        code: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        run_all_cases: bool = True,
        job_id=None,
    ) -> Job:
        """A sandbox job that runs ``prelude`` + ``code`` against every test of this problem."""
        if self.prelude:
            code = self.prelude.rstrip("\n") + "\n" + code
        return Job(
            code=code,
            kind=self.test_kind,
            tests=list(self.tests),
            entry_point=self.entry_point,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            run_all_cases=run_all_cases,
            id=self.id if job_id is None else job_id,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        if not isinstance(d, dict):
            raise ProblemError(f"a problem must be an object, got {type(d).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ProblemError(f"unknown field(s) {unknown} (known: {sorted(known)})")
        missing = [k for k in ("id", "question", "test_kind", "tests") if k not in d]
        if missing:
            raise ProblemError(f"missing field(s) {missing}")
        return cls(**d)
