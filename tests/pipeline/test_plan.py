"""plan.execute: what the run does around the checks (here: the first readings taken as it begins)."""

from conftest import make_ctx

from preflight.base.progress import Progress
from preflight.pipeline.check import Check, Context, Result, Status
from preflight.pipeline.plan import Plan, execute
from preflight.pipeline.settings import Settings


class Console:
    progress = Progress()

    def start(self, check: Check) -> None: ...
    def finish(self, result: Result) -> None: ...
    def note(self, text: str) -> None: ...


class Early(Check):
    name, description = "early", "runs first: sees the readings the checks after it took"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, ", ".join(sorted(ctx.readings)))


class Reads(Check):
    name, description = "reads", "takes its first reading as the run begins"

    def begin(self, ctx: Context) -> None:
        ctx.readings[self.name] = f"taken after {len(ctx.results)} checks"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, ctx.readings.pop(self.name))


class Broken(Check):
    name, description = "broken", "its first reading raises half way"

    def begin(self, ctx: Context) -> None:
        ctx.readings[self.name] = "half a reading"
        raise OSError("sysfs went away")

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, f"reading: {ctx.readings.get(self.name)}")


def test_every_check_takes_its_first_reading_before_the_first_check_and_a_failed_one_is_dropped():
    plan = Plan(make_ctx().profile, [Early(), Reads(), Broken()])
    report = execute(plan, Settings(), Console())
    assert [(c.check, c.status, c.summary) for c in report.checks] == [
        ("early", Status.PASS, "reads"),
        ("reads", Status.PASS, "taken after 0 checks"),
        ("broken", Status.PASS, "reading: None"),  # the check reads at its turn, as without a first reading
    ]
