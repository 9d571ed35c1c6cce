"""CTRL at test time: generator solutions, then rounds of critique -> revision -> sandbox.

``critique_rounds`` is shared by `fastcrit critique` (fastcrit.recipes.ctrl.evaluate, with the seeds
and baselines) and by the CTRL recipe's evaluation (generator alone, then one round with the
critic). Both critic and generator are ``ChatModel``s, so either may be a local model or an
OpenAI-compatible endpoint.

Per round, every problem's current solution is critiqued (greedy, or sampled as the caller says).
A critique without an overall
judgment (or whose prompt is too long for the critic) leaves the solution as it is and counts as
invalid; otherwise the generator revises it greedily and the revision, run in the sandbox, becomes
the current solution (a revision prompt too long for the generator also leaves it as it is).
Reported after each round: pass@1 (every test passes), the critic's judgment accuracy against the
real outcome of the solution it judged (an invalid critique counts as wrong), how many
revisions went fail -> pass (fixed) and pass -> fail (broken), and how often the generator kept the
solution as it was when the critique judged it correct (``kept_when_correct``: a generator that
rewrites code it was told is correct makes the critic's judgment count for little).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fastcrit.data.critique import parse_judgment, review_agrees
from fastcrit.data.ctrl_prompts import critique_messages, generation_messages, revision_messages
from fastcrit.data.problems import Problem
from fastcrit.reward import RewardItem
from fastcrit.reward.code import extract_program
from fastcrit.rollout.chat import ChatModel
from fastcrit.types import is_greedy


@dataclass
class Attempt:
    """A problem and its current solution, with the solution's real outcome in the sandbox."""

    problem: Problem
    solution: str  # the generator's answer text (code fenced or raw)
    passed: bool  # every test passes
    pass_rate: float
    failures: list[str]  # messages of the tests that did not pass (execution feedback)
    failed_tests: list[int] = field(default_factory=list)  # their indices in problem.tests


@dataclass
class RoundReport:
    round: int  # 0 = the generator alone
    pass_at_1: float  # after this round
    judgment_acc: float | None = None  # None for round 0
    valid_rate: float | None = None
    fixed: int = 0  # fail -> pass
    broken: int = 0  # pass -> fail
    failing_before: int = 0
    passing_before: int = 0
    too_long: int = 0  # critiques or revisions whose prompt did not fit
    judged_correct: int = 0  # revisions sent after an "Overall judgment: Correct"
    kept: int = 0  # ... that left the solution unchanged
    reviewed: int = 0  # critiques with a review of the code's line and a verdict
    true_to_review: int = 0  # ... whose marked words and verdict follow what their review says is needed and had
    pass_at_k: float | None = None  # problems one of whose chains passes after this round (None: not counted)

    def metrics(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}pass@1": self.pass_at_1}
        if self.pass_at_k is not None:
            out[f"{prefix}pass@k"] = self.pass_at_k
        if self.round:
            out.update(
                {
                    f"{prefix}judgment_acc": self.judgment_acc,
                    f"{prefix}valid_rate": self.valid_rate,
                    f"{prefix}fixed": self.fixed / max(self.failing_before, 1),
                    f"{prefix}broken": self.broken / max(self.passing_before, 1),
                    # the paper's Δ↑ and Δ↓: fixed and broken as shares of all problems
                    f"{prefix}delta_up": self.fixed / max(self.failing_before + self.passing_before, 1),
                    f"{prefix}delta_down": self.broken / max(self.failing_before + self.passing_before, 1),
                    f"{prefix}kept_when_correct": self.kept / max(self.judged_correct, 1),
                    f"{prefix}review_agrees": self.true_to_review / max(self.reviewed, 1),
                }
            )
        return {k: v for k, v in out.items() if v is not None}  # a round without verdicts has no accuracy


def unchanged(solution: str, revision: str) -> bool:
    """The revision's program is the solution's again (whitespace aside; prose around it aside)."""
    return extract_program(solution)[0].split() == extract_program(revision)[0].split()


def answer_of(text: str) -> str:
    """What a revision carries into the next round: its program, fenced as answers are written,
    without the prose around it (a reviser's remarks on the critique are not part of its answer);
    a text without a fenced program stays as it is."""
    program, rule = extract_program(text)
    return f"```python\n{program.rstrip()}\n```" if rule.startswith("fenced") else text


def kept_when_correct(
    attempts: list[Attempt], judged: list[bool | None], sent: list[tuple[int, str]]
) -> tuple[int, int]:
    """(revisions sent after a "Correct" judgment, those that left the solution unchanged)."""
    told = [(i, t) for i, t in sent if judged[i]]
    return len(told), sum(unchanged(attempts[i].solution, t) for i, t in told)


def execute(reward, problems: list[Problem], texts: list[str]) -> list[Attempt]:
    """Run each text's program against its problem's tests (all concurrently)."""
    results = reward([RewardItem(p.question, t, "", problem=p) for p, t in zip(problems, texts)])
    out = []
    for p, t, r in zip(problems, texts, results):
        total = r.info.get("total", 0)
        passed = total > 0 and r.info.get("passed", 0) == total
        failed = [i for i, s in enumerate(r.info.get("statuses", [])) if s != "passed"]
        out.append(Attempt(p, t, passed, float(r.info.get("pass_rate", 0.0)), list(r.info["failures"]), failed))
    return out


def sample_solutions(
    generator: ChatModel,
    problems: list[Problem],
    *,
    k: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    style: str = "paper",
    top_p: float = 1.0,
) -> list[tuple[Problem, str]]:
    """``k`` answers per problem from the generator (problem-major order), asked in the prompts
    of ``style`` (``ctrl.prompts``)."""
    convs = [generation_messages(p, style) for p in problems for _ in range(k)]
    outs = generator.chat(
        convs,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        top_p=1.0 if is_greedy(temperature) else top_p,
    )
    return [(problems[i // k], o.text) for i, o in enumerate(outs)]


def revise(
    generator: ChatModel,
    attempts: list[Attempt],
    critiques: list[str],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    skip: set[int] = frozenset(),
    style: str = "paper",
) -> tuple[list[bool | None], list[tuple[int, str]]]:
    """The generator revises each solution after its critique. A critique with no overall
    judgment is not sent, nor one in ``skip`` (judged invalid by the caller), nor a revision prompt
    the generator cannot take. Returns every critique's judgment and the (critique index, revision
    text) pairs to execute."""
    judged = [parse_judgment(t) for t in critiques]
    valid = [i for i, j in enumerate(judged) if j is not None and i not in skip]
    convs = [(i, revision_messages(attempts[i].problem, attempts[i].solution, critiques[i], style)) for i in valid]
    return judged, revise_from(generator, convs, max_new_tokens=max_new_tokens, temperature=temperature)


def revise_from(
    generator: ChatModel, convs: list[tuple[int, list[dict]]], *, max_new_tokens: int, temperature: float = 0.0
) -> list[tuple[int, str]]:
    """The generator's answers to (attempt index, revision conversation) pairs, as (index, text);
    a conversation it cannot take is left out (its solution stays)."""
    outs = generator.chat([c for _, c in convs], max_new_tokens=max_new_tokens, temperature=temperature)
    return [(i, o.text) for (i, _), o in zip(convs, outs) if o.finish_reason != "prompt_too_long"]


def run_revisions(reward, attempts: list[Attempt], sent: list[tuple[int, str]]) -> dict[int, Attempt]:
    """The revisions run in the sandbox: attempt index -> the revised attempt (carrying the
    revision's program, not its prose)."""
    return {
        i: replace(b, solution=answer_of(t))
        for (i, t), b in zip(sent, execute(reward, [attempts[i].problem for i, _ in sent], [t for _, t in sent]))
    }


def tally(report: RoundReport, attempts: list[Attempt], ran: dict[int, Attempt]) -> list[Attempt]:
    """The attempts after a round (a revised one where it ran, else as it was), counted into
    ``report``: fixed, broken, before and pass@1."""
    new = [ran.get(i, a) for i, a in enumerate(attempts)]
    for a, b in zip(attempts, new):
        report.failing_before += not a.passed
        report.passing_before += a.passed
        report.fixed += (not a.passed) and b.passed
        report.broken += a.passed and not b.passed
    report.pass_at_1 = sum(b.passed for b in new) / max(len(new), 1)
    return new


def pass_at_k(attempts: list[Attempt], per_problem: int) -> float:
    """The share of problems one of whose ``per_problem`` attempts (consecutive, problem-major)
    passes: pass@k with k = ``per_problem`` samples of each problem."""
    groups = [attempts[i : i + per_problem] for i in range(0, len(attempts), per_problem)]
    return sum(any(a.passed for a in g) for g in groups) / max(len(groups), 1)


def critique_round(
    critic: ChatModel,
    generator: ChatModel,
    reward,
    attempts: list[Attempt],
    *,
    critic_tokens: int,
    generator_tokens: int,
    round_no: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
    top_p: float = 1.0,
    style: str = "paper",
) -> tuple[list[Attempt], RoundReport, list[dict]]:
    """One critique -> revision round over every attempt: the critic writes at ``temperature`` and
    ``top_p`` (greedy by default; sampled, attempt i draws with ``seed`` and its place i, so a list of
    repeated attempts gets independent critiques), the generator revises greedily. Returns the new
    attempts, the report and one record per problem (texts and verdicts, for the JSONL file)."""
    crits = critic.chat(
        [critique_messages(a.problem, a.solution, style) for a in attempts],
        max_new_tokens=critic_tokens,
        temperature=temperature,
        seed=None if is_greedy(temperature) else seed,
        top_p=top_p,
    )
    texts = ["" if c.finish_reason == "prompt_too_long" else c.text for c in crits]
    judged, sent = revise(generator, attempts, texts, max_new_tokens=generator_tokens, style=style)
    raw = dict(sent)  # the revisions as written (prose and all); attempts carry their programs
    ran = run_revisions(reward, attempts, sent)  # no valid critique, or no revision sent: the solution stays
    valid = sum(j is not None for j in judged)
    report = RoundReport(
        round_no, 0.0, too_long=sum(c.finish_reason == "prompt_too_long" for c in crits) + valid - len(sent)
    )
    report.judged_correct, report.kept = kept_when_correct(attempts, judged, sent)
    agrees = [review_agrees(t, a.solution) for t, a in zip(texts, attempts)]
    report.reviewed = sum(g is not None for g in agrees)
    report.true_to_review = sum(g is True for g in agrees)
    new = tally(report, attempts, ran)
    records = [
        {
            "problem_id": a.problem.id,
            "round": round_no,
            "solution": a.solution,
            "passed_before": a.passed,
            "critique": texts[i],
            "judgment": None if judged[i] is None else ("Correct" if judged[i] else "Incorrect"),
            "review_agrees": agrees[i],
            "revised": i in ran,
            "revision": raw.get(i),
            "passed_after": b.passed,
            "pass_rate_after": b.pass_rate,
        }
        for i, (a, b) in enumerate(zip(attempts, new))
    ]
    n = max(len(attempts), 1)
    report.judgment_acc = sum(j is not None and j == a.passed for j, a in zip(judged, attempts)) / n
    report.valid_rate = valid / n
    return new, report, records


def critique_rounds(
    critic: ChatModel,
    generator: ChatModel,
    reward,
    attempts: list[Attempt],
    *,
    rounds: int,
    critic_tokens: int,
    generator_tokens: int,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
    top_p: float = 1.0,
    style: str = "paper",
    per_problem: int = 1,
) -> tuple[list[RoundReport], list[dict]]:
    """Round 0 (the generator alone) and ``rounds`` critique -> revision rounds. With ``samples`` >
    1 (sampled critiques), each attempt starts that many chains; the reports are over all of them
    and each record names its ``sample``. ``per_problem``: the attempts of each problem (consecutive,
    problem-major); every report then has pass@k over a problem's chains."""
    attempts = repeat_attempts(attempts, samples)
    group = per_problem * samples
    reports = [
        RoundReport(0, sum(a.passed for a in attempts) / max(len(attempts), 1), pass_at_k=pass_at_k(attempts, group))
    ]
    records: list[dict] = []
    for r in range(1, rounds + 1):
        attempts, rep, recs = critique_round(
            critic,
            generator,
            reward,
            attempts,
            round_no=r,
            critic_tokens=critic_tokens,
            generator_tokens=generator_tokens,
            temperature=temperature,
            seed=round_seed(seed, r),
            top_p=top_p,
            style=style,
        )
        rep.pass_at_k = pass_at_k(attempts, group)
        reports.append(rep)
        records += [dict(rec, sample=i % samples) for i, rec in enumerate(recs)]
    return reports, records


def repeat_attempts(attempts: list[Attempt], samples: int) -> list[Attempt]:
    """Each attempt ``samples`` times in a row (the chains of sampled critiques it starts)."""
    return [a for a in attempts for _ in range(samples)]


def round_seed(seed: int, round_no: int) -> int:
    """The critic's sampling seed in round ``round_no``: rounds draw apart (an engine's draws depend
    on the seed plus the row's place, and rows number far fewer than this step)."""
    return seed + 1_000_003 * round_no


def critique_protocol(temperature: float, samples: int, top_p: float = 1.0) -> str:
    """How the critiques of a report were written, in words."""
    if is_greedy(temperature):
        return "greedy critiques"
    return f"{samples} critique(s) per solution at temperature {temperature:g}" + (
        f", top-p {top_p:g}" if top_p < 1 else ""
    )


def format_reports(reports: list[RoundReport]) -> list[str]:
    lines = [
        "  round  pass@1  judgment_acc  valid  fixed (fail->pass)  broken (pass->fail)"
        "  delta_up  delta_down  kept when judged correct"
    ]
    for r in reports:
        if r.round == 0:
            lines.append(f"  {0:5d}  {r.pass_at_1:6.3f}  (generator alone)")
        else:
            m = r.metrics("")
            lines.append(
                f"  {r.round:5d}  {r.pass_at_1:6.3f}  {r.judgment_acc:12.3f}  {r.valid_rate:5.3f}"
                f"  {r.fixed:5d} / {r.failing_before:<5d}       {r.broken:5d} / {r.passing_before:<5d}"
                f"        {m['delta_up']:8.3f}  {m['delta_down']:10.3f}"
                f"  {r.kept:5d} / {r.judged_correct}"
            )
    return lines
