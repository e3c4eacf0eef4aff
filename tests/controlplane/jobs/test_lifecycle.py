"""The job lifecycle (`decide`, `evolve`, `replay`): random command sequences checked against a
small reference model and the lifecycle's invariants, then one example per rule a user meets."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from uuid import UUID

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from controlplane.event_registry import EVENT_REGISTRY
from controlplane.jobs.events import (
    CheckpointRequested,
    CheckpointSaved,
    JobCancelled,
    JobCompleted,
    JobDeploying,
    JobEvent,
    JobFailed,
    JobProcessing,
    JobRestarted,
    JobSubmitted,
)
from controlplane.jobs.lifecycle import (
    Cancel,
    Command,
    Complete,
    Deploy,
    EnterPhase,
    Fail,
    Job,
    JobStatus,
    Refused,
    RequestCheckpoint,
    Restart,
    SaveCheckpoint,
    Submit,
    Transition,
    decide,
    evolve,
    replay,
)
from controlplane.jobs.manifest import JobManifest

S = JobStatus
JOB_ID = UUID(int=0x7A1)
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
TERMINAL = (S.COMPLETED, S.FAILED, S.CANCELLED)
RUNNING = (S.DEPLOYING, S.DOWNLOADING, S.PROCESSING, S.STORING)
PHASES = (S.DOWNLOADING, S.PROCESSING, S.STORING)
# Where each live state sits in one attempt's march; an attempt only ever moves to the right.
ORDER = {S.QUEUED: 0, S.DEPLOYING: 1, S.DOWNLOADING: 2, S.PROCESSING: 3, S.STORING: 4}


def manifest(max_restarts: int = 3) -> JobManifest:
    return JobManifest(
        name="resnet", image="trainer:1", command=["train"], max_restarts=max_restarts
    )


def stored(event: JobEvent) -> JobEvent:
    """The event as a reader gets it back from the store: through its JSON and the registry."""
    decoded = EVENT_REGISTRY.decode(event.type_name, event.schema_version, event.model_dump_json())
    assert isinstance(decoded, JobEvent)
    return decoded


# --- the reference model ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Model:
    """What a user can tell about a job, predicted from the rules, not from the code."""

    state: JobStatus
    max_restarts: int
    attempt: int = 1
    restarts: int = 0
    checkpoint: str | None = None
    checkpoint_requested: bool = False
    failure_words: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()


def predict(model: Model | None, command: Command) -> Model | None:
    """The model after `command`, or None where the rules say it must be refused."""
    if isinstance(command, Submit):
        return Model(S.QUEUED, command.manifest.max_restarts) if model is None else None
    if model is None or model.state in TERMINAL:
        return None
    now = model.state
    replace = dataclasses.replace
    match command:
        case Deploy():
            return replace(model, state=S.DEPLOYING) if now is S.QUEUED else None
        case EnterPhase(phase=phase):
            legal = phase in PHASES and now in RUNNING and ORDER[phase] > ORDER[now]
            return replace(model, state=phase) if legal else None
        case Complete(exit_codes=codes):
            legal = now in PHASES and not any(codes)
            return replace(model, state=S.COMPLETED, exit_codes=tuple(codes)) if legal else None
        case Fail(reason=reason, exit_code=code):
            reported = () if code is None else (code,)
            return replace(model, state=S.FAILED, failure_words=(reason,), exit_codes=reported)
        case Cancel():
            return replace(model, state=S.CANCELLED)
        case Restart(reason=reason):
            if now not in RUNNING:
                return None
            if model.restarts >= model.max_restarts:
                words = (reason, "restart", str(model.max_restarts))
                return replace(model, state=S.FAILED, failure_words=words)
            return replace(
                model,
                state=S.QUEUED,
                attempt=model.attempt + 1,
                restarts=model.restarts + 1,
                checkpoint_requested=False,
            )
        case RequestCheckpoint():
            # One pending at a time.
            legal = now is S.PROCESSING and not model.checkpoint_requested
            return replace(model, checkpoint_requested=True) if legal else None
        case SaveCheckpoint(path=path):
            legal = now in RUNNING
            return replace(model, checkpoint=path, checkpoint_requested=False) if legal else None
    raise AssertionError(f"the model does not know {command!r}")


def assert_matches(job: Job, model: Model) -> None:
    assert job.state is model.state
    assert job.attempt == model.attempt
    assert job.restarts == model.restarts
    assert job.manifest.max_restarts == model.max_restarts
    assert (job.last_checkpoint.path if job.last_checkpoint else None) == model.checkpoint
    assert (job.checkpoint_requested_at is not None) == model.checkpoint_requested
    if model.state is S.FAILED:
        assert job.failure_reason is not None
        for word in model.failure_words:
            assert word in job.failure_reason
    if model.state in (S.COMPLETED, S.FAILED):
        assert tuple(job.exit_codes) == model.exit_codes


def assert_history_well_formed(job: Job) -> None:
    """The transitions tell the job's whole story: ordered, timed, phases never revisited."""
    history = job.transitions
    assert history[0].state is S.QUEUED
    assert history[0].at == job.submitted_at
    assert history[-1].state is job.state
    assert history[-1].attempt == job.attempt
    for before, after in pairwise(history):
        assert before.at <= after.at
        assert before.state not in TERMINAL
        assert after.attempt in (before.attempt, before.attempt + 1)
        if after.attempt == before.attempt:
            # Within one attempt a job only moves forward (skipping phases is fine).
            assert after.state in TERMINAL or ORDER[after.state] > ORDER[before.state]
        else:
            # A new attempt starts by going back to the queue, saying why.
            assert after.state is S.QUEUED
            assert after.reason is not None
    assert job.updated_at >= history[-1].at


# --- random command sequences ----------------------------------------------------------------

gaps = st.integers(min_value=0, max_value=3 * 3600)  # 0: two commands in the same instant
reasons = st.text(max_size=12)


@dataclasses.dataclass(frozen=True)
class Step:
    """One random command, before the machine gives it its instant (and, for `advance`, its
    meaning: the next step a healthy job would take from wherever it is)."""

    kind: str
    gap: int
    arg: Any = None


# Weighted so that a run gets deep: with every command equally likely, a job is almost always
# failed or cancelled before it reaches PROCESSING, and never uses up its restarts.
STEP_ARGUMENTS: dict[str, tuple[st.SearchStrategy[Any], int]] = {
    "advance": (st.booleans(), 10),
    "restart": (reasons, 3),
    "save_checkpoint": (st.integers(0, 10**6), 2),
    "request_checkpoint": (st.none(), 2),
    "enter_phase": (st.sampled_from(list(S)), 2),
    "complete": (st.lists(st.sampled_from([0, 0, 1, -9, 137]), min_size=1, max_size=3), 2),
    "deploy": (st.integers(1, 3), 1),
    "submit": (st.integers(0, 3), 1),
    "fail": (st.tuples(reasons, st.none() | st.integers(-15, 255)), 1),
    "cancel": (reasons, 1),
}
steps = st.sampled_from(
    [kind for kind, (_, weight) in STEP_ARGUMENTS.items() for _ in range(weight)]
).flatmap(lambda kind: st.builds(Step, st.just(kind), gaps, STEP_ARGUMENTS[kind][0]))


class JobLifecycle(RuleBasedStateMachine):
    """Drives one job with random commands; every step is checked against `predict` and the
    lifecycle's invariants, and the whole log is replayed (also as read back from the store)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.job: Job | None = None
        self.model: Model | None = None
        self.events: list[JobEvent] = []
        self.from_store: Job | None = None
        self.finished = False

    def _execute(self, command: Command) -> None:
        before = self.job
        snapshot = None if before is None else before.model_dump()
        expected = predict(self.model, command)
        try:
            new_events = decide(command, before)
        except Refused as refusal:
            assert expected is None, f"{command!r} was refused: {refusal}"
            self._check_refusal(refusal, before)
            # A refusal writes nothing and changes nothing, not even in place.
            assert self.job is before
            assert (None if before is None else before.model_dump()) == snapshot
            return
        assert expected is not None, f"{command!r} should have been refused in {self.model}"
        assert new_events, "an accepted command always records what happened"
        job = before
        for event in new_events:
            assert event.at == command.at
            job = evolve(job, event)  # decide never produces an event evolve rejects
            self.from_store = evolve(self.from_store, stored(event))
        assert job is not None
        self._check_step(before, job, command)
        assert_matches(job, expected)
        self.job, self.model = job, expected
        self.events.extend(new_events)

    def _check_refusal(self, refusal: Refused, before: Job | None) -> None:
        message = str(refusal)
        assert message
        if before is None:
            assert refusal.not_found, "a job that does not exist is not found"
        else:
            assert not refusal.not_found, f"job exists but refusal says not found: {message}"
            assert before.state.value in message, f"refusal does not name the state: {message}"

    def _check_step(self, before: Job | None, after: Job, command: Command) -> None:
        assert after.updated_at == command.at
        if before is None:
            assert after.transitions == [Transition(state=S.QUEUED, at=command.at, attempt=1)]
            return
        assert after.job_id == before.job_id
        assert after.attempt >= before.attempt
        assert after.restarts >= before.restarts
        assert after.restarts <= after.manifest.max_restarts
        restarted = after.attempt > before.attempt
        if after.state is before.state and not restarted:
            assert after.transitions == before.transitions  # checkpoints are not states
            return
        # A state change appends exactly one transition, carrying the command's instant.
        assert after.transitions[:-1] == before.transitions
        entered = after.transitions[-1]
        assert (entered.state, entered.at, entered.attempt) == (
            after.state,
            command.at,
            after.attempt,
        )
        if isinstance(command, Restart | Fail | Cancel):
            assert entered.reason is not None and command.reason in entered.reason

    def _command(self, step: Step, at: datetime) -> Command:
        job, arg = self.job, step.arg
        match step.kind:
            case "advance" if job is not None and job.state not in TERMINAL:
                if job.state is S.QUEUED:
                    return Deploy(["node-a"], ["GPU-0"], len(self.events), at)
                if job.state is S.STORING or (arg and job.state is S.PROCESSING):
                    return Complete([0] * job.manifest.learners, at)
                following = [phase for phase in PHASES if ORDER[phase] > ORDER[job.state]]
                return EnterPhase(following[1 if arg and len(following) > 1 else 0], at)
            case "advance" | "request_checkpoint":
                return RequestCheckpoint(at)
            case "restart":
                return Restart(arg, at)
            case "save_checkpoint":
                # A unique path, so "the latest checkpoint" is never ambiguous.
                return SaveCheckpoint(arg, f"/ckpt/{len(self.events)}-{arg}", 1 << 20, 0.5, at)
            case "enter_phase":
                return EnterPhase(arg, at)
            case "complete":
                return Complete(arg, at)
            case "deploy":
                return Deploy([f"node-{i}" for i in range(arg)], ["GPU-0"] * arg, arg, at)
            case "submit":
                return Submit(JOB_ID, "acme", manifest(arg), at)
            case "fail":
                return Fail(arg[0], at, arg[1])
            case "cancel":
                return Cancel(arg, at)
        raise AssertionError(f"unknown step {step!r}")

    @initialize(
        submitted=st.sampled_from([True, True, True, False]), max_restarts=st.integers(0, 3)
    )
    def start(self, submitted: bool, max_restarts: int) -> None:
        # Some runs never submit: every command must then be "not found", never a state error.
        if submitted:
            self._execute(Submit(JOB_ID, "acme", manifest(max_restarts), T0))

    @precondition(lambda self: not self.finished)
    @rule(step=steps)
    def command(self, step: Step) -> None:
        self.now += timedelta(seconds=step.gap)
        self._execute(self._command(step, self.now))
        if self.job is not None and self.job.state in TERMINAL:
            # Every command, once: all refused, nothing changes. Then the run has nothing to add.
            self.now += timedelta(seconds=1)
            for command in every_command(self.now):
                self._execute(command)
            self.finished = True

    @precondition(lambda self: self.finished)
    @rule()
    def finished_job_stays_finished(self) -> None:
        assert self.job is not None and self.job.state in TERMINAL

    @invariant()
    def replay_equals_incremental(self) -> None:
        assert replay(self.events) == self.job
        # The projection folds events read back from the store onto its stored JSON document.
        assert self.from_store == self.job
        if self.job is not None:
            assert Job.model_validate_json(self.job.model_dump_json()) == self.job

    @invariant()
    def history_well_formed(self) -> None:
        if self.job is not None:
            assert_history_well_formed(self.job)
            assert self.job.attempt == self.job.restarts + 1


TestJobLifecycle = JobLifecycle.TestCase
TestJobLifecycle.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


# --- example-based tests: one per rule a user meets --------------------------------------------


class Story:
    """One job driven step by step, with a clock that moves a minute per command."""

    def __init__(self, max_restarts: int = 3) -> None:
        self.clock = T0
        self.events: list[JobEvent] = []
        self.job: Job | None = None
        self.do(lambda at: Submit(JOB_ID, "acme", manifest(max_restarts), at))

    def at(self) -> datetime:
        self.clock += timedelta(minutes=1)
        return self.clock

    def do(self, make: Any) -> list[JobEvent]:
        """Decide and fold the command `make(at)`; Refused propagates and changes nothing."""
        events = decide(make(self.at()), self.job)
        for event in events:
            self.job = evolve(self.job, event)
        self.events.extend(events)
        return events

    @property
    def current(self) -> Job:
        assert self.job is not None
        return self.job

    def deploy(self, epoch: int = 1) -> list[JobEvent]:
        return self.do(lambda at: Deploy(["node-a"], ["GPU-1"], epoch, at))

    def phase(self, phase: JobStatus) -> list[JobEvent]:
        return self.do(lambda at: EnterPhase(phase, at))

    def complete(self, codes: Sequence[int] = (0,)) -> list[JobEvent]:
        return self.do(lambda at: Complete(list(codes), at))

    def fail(self, reason: str = "learner crashed", code: int | None = 1) -> list[JobEvent]:
        return self.do(lambda at: Fail(reason, at, code))

    def cancel(self, reason: str = "no longer needed") -> list[JobEvent]:
        return self.do(lambda at: Cancel(reason, at))

    def restart(self, reason: str = "node lost") -> list[JobEvent]:
        return self.do(lambda at: Restart(reason, at))

    def request_checkpoint(self) -> list[JobEvent]:
        return self.do(lambda at: RequestCheckpoint(at))

    def save_checkpoint(self, step: int, path: str) -> list[JobEvent]:
        return self.do(lambda at: SaveCheckpoint(step, path, 4096, 1.5, at))


def story_in(state: JobStatus, max_restarts: int = 3) -> Story:
    """A job brought to `state` the ordinary way."""
    story = Story(max_restarts)
    path = {
        S.QUEUED: [],
        S.DEPLOYING: [S.DEPLOYING],
        S.DOWNLOADING: [S.DEPLOYING, S.DOWNLOADING],
        S.PROCESSING: [S.DEPLOYING, S.DOWNLOADING, S.PROCESSING],
        S.STORING: [S.DEPLOYING, S.DOWNLOADING, S.PROCESSING, S.STORING],
        S.COMPLETED: [S.DEPLOYING, S.PROCESSING, S.COMPLETED],
        S.FAILED: [S.DEPLOYING, S.FAILED],
        S.CANCELLED: [S.CANCELLED],
    }[state]
    for step in path:
        if step is S.DEPLOYING:
            story.deploy()
        elif step in PHASES:
            story.phase(step)
        elif step is S.COMPLETED:
            story.complete()
        elif step is S.FAILED:
            story.fail()
        else:
            story.cancel()
    assert story.current.state is state
    return story


def refused(story: Story, make: Any) -> Refused:
    """Assert `make(at)` is refused on the story's job, names its state and changes nothing."""
    before = story.current
    snapshot = before.model_dump()
    with pytest.raises(Refused) as caught:
        story.do(make)
    assert not caught.value.not_found
    assert before.state.value in str(caught.value)
    assert story.current is before and before.model_dump() == snapshot
    return caught.value


def every_command(at: datetime) -> list[Command]:
    return [
        Submit(JOB_ID, "acme", manifest(), at),
        Deploy(["node-a"], ["GPU-1"], 7, at),
        *(EnterPhase(state, at) for state in S),
        Complete([0], at),
        Fail("late failure", at, 1),
        Cancel("late cancel", at),
        Restart("late restart", at),
        RequestCheckpoint(at),
        SaveCheckpoint(10, "/ckpt/late", 1, 0.1, at),
    ]


def test_a_job_runs_through_every_phase_with_a_timed_history() -> None:
    story = Story()
    story.deploy()
    story.phase(S.DOWNLOADING)
    story.phase(S.PROCESSING)
    story.phase(S.STORING)
    story.complete([0, 0])
    job = story.current
    assert job.state is S.COMPLETED
    assert job.exit_codes == [0, 0]
    assert [(t.state, t.at, t.attempt) for t in job.transitions] == [
        (state, T0 + timedelta(minutes=minute), 1)
        for minute, state in enumerate([S.QUEUED, *RUNNING, S.COMPLETED], start=1)
    ]
    assert job.submitted_at == T0 + timedelta(minutes=1)
    assert job.updated_at == T0 + timedelta(minutes=6)


def test_deploy_records_the_placement_and_fencing_epoch() -> None:
    story = Story()
    (event,) = story.do(lambda at: Deploy(["node-a", "node-b"], ["GPU-1", "GPU-2"], 42, at))
    assert isinstance(event, JobDeploying)
    assert (event.attempt, event.epoch) == (1, 42)
    job = story.current
    assert (job.state, job.nodes, job.gpus, job.epoch) == (
        S.DEPLOYING,
        ["node-a", "node-b"],
        ["GPU-1", "GPU-2"],
        42,
    )


@pytest.mark.parametrize("state", [s for s in S if s is not S.QUEUED])
def test_only_a_queued_job_is_deployed(state: JobStatus) -> None:
    refused(story_in(state), lambda at: Deploy(["node-b"], ["GPU-9"], 2, at))


@pytest.mark.parametrize("state", TERMINAL)
def test_cancel_of_a_finished_job_is_refused(state: JobStatus) -> None:
    refusal = refused(story_in(state), lambda at: Cancel("too late", at))
    assert state.value in str(refusal)


COMMAND_NAMES = [
    f"{type(command).__name__}({command.phase})"
    if isinstance(command, EnterPhase)
    else type(command).__name__
    for command in every_command(T0)
]


@pytest.mark.parametrize("state", TERMINAL)
@pytest.mark.parametrize("index", range(len(COMMAND_NAMES)), ids=COMMAND_NAMES)
def test_a_finished_job_never_changes(state: JobStatus, index: int) -> None:
    story = story_in(state)
    refused(story, lambda at: every_command(at)[index])


@pytest.mark.parametrize("state", [S.QUEUED, *RUNNING])
def test_a_live_job_can_be_cancelled_with_a_reason(state: JobStatus) -> None:
    story = story_in(state)
    (event,) = story.cancel("user changed their mind")
    assert isinstance(event, JobCancelled)
    last = story.current.transitions[-1]
    assert (last.state, last.reason) == (S.CANCELLED, "user changed their mind")


@pytest.mark.parametrize("state", [S.QUEUED, *RUNNING])
def test_a_live_job_can_fail_with_a_reason_and_exit_code(state: JobStatus) -> None:
    story = story_in(state)
    (event,) = story.fail("out of memory", 137)
    assert isinstance(event, JobFailed)
    job = story.current
    assert (job.state, job.failure_reason, job.exit_codes) == (S.FAILED, "out of memory", [137])
    assert job.transitions[-1].reason == "out of memory"


def test_a_missing_job_is_not_found_for_every_command_but_submit() -> None:
    for command in every_command(T0):
        if isinstance(command, Submit):
            assert [type(e) for e in decide(command, None)] == [JobSubmitted]
            continue
        with pytest.raises(Refused) as caught:
            decide(command, None)
        assert caught.value.not_found, command


def test_submitting_an_existing_job_is_refused_but_not_as_not_found() -> None:
    story = Story()
    refused(story, lambda at: Submit(JOB_ID, "acme", manifest(), at))


@pytest.mark.parametrize("state", list(S))
def test_a_checkpoint_is_requested_only_while_processing(state: JobStatus) -> None:
    story = story_in(state)
    if state is not S.PROCESSING:
        refused(story, RequestCheckpoint)
        return
    before = story.current
    (event,) = story.request_checkpoint()
    assert isinstance(event, CheckpointRequested)
    job = story.current
    assert job.checkpoint_requested_at == event.at
    # A checkpoint is an event, not a state: the job stays PROCESSING and its history is the same.
    assert (job.state, job.transitions) == (S.PROCESSING, before.transitions)
    story.save_checkpoint(100, "/ckpt/100")
    assert story.current.checkpoint_requested_at is None


def test_a_second_checkpoint_request_while_one_is_pending_is_refused() -> None:
    story = story_in(S.PROCESSING)
    story.request_checkpoint()
    with pytest.raises(Refused, match="is still pending") as caught:
        decide(RequestCheckpoint(T0 + timedelta(hours=1)), story.current)
    assert not caught.value.not_found
    story.save_checkpoint(100, "/ckpt/100")
    (again,) = story.request_checkpoint()
    assert isinstance(again, CheckpointRequested)


@pytest.mark.parametrize("state", [S.QUEUED, *TERMINAL])
def test_a_checkpoint_is_recorded_only_while_learners_run(state: JobStatus) -> None:
    refused(story_in(state), lambda at: SaveCheckpoint(5, "/ckpt/5", 1, 0.1, at))


def test_a_restart_resumes_from_the_latest_checkpoint() -> None:
    story = story_in(S.PROCESSING)
    story.save_checkpoint(100, "/ckpt/100")
    story.save_checkpoint(200, "/ckpt/200")
    (event,) = story.restart()
    assert isinstance(event, JobRestarted)
    assert event.resume_from == "/ckpt/200"
    last = story.current.last_checkpoint
    assert last is not None and (last.path, last.step, last.attempt) == ("/ckpt/200", 200, 1)


def test_a_restart_without_a_checkpoint_starts_from_scratch() -> None:
    story = story_in(S.PROCESSING)
    (event,) = story.restart()
    assert isinstance(event, JobRestarted) and event.resume_from is None


def test_a_checkpoint_outlives_the_attempt_that_saved_it() -> None:
    story = story_in(S.PROCESSING)
    story.save_checkpoint(100, "/ckpt/attempt-1")
    story.restart("node lost")
    story.deploy(epoch=2)  # attempt 2 crashes before it saves anything
    (event,) = story.restart("learner crashed")
    assert isinstance(event, JobRestarted) and event.resume_from == "/ckpt/attempt-1"
    story.deploy(epoch=3)
    story.phase(S.PROCESSING)
    story.save_checkpoint(300, "/ckpt/attempt-3")
    (event,) = story.restart("preempted")
    assert isinstance(event, JobRestarted) and event.resume_from == "/ckpt/attempt-3"


def test_a_restart_requeues_the_job_with_the_next_attempt_and_its_reason() -> None:
    story = story_in(S.PROCESSING)
    (event,) = story.restart("node gpu-07 lost")
    assert isinstance(event, JobRestarted) and event.attempt == 2
    job = story.current
    assert (job.state, job.attempt, job.restarts) == (S.QUEUED, 2, 1)
    assert job.transitions[-1] == Transition(
        state=S.QUEUED, at=event.at, attempt=2, reason="node gpu-07 lost"
    )
    assert (job.nodes, job.gpus) == ([], [])  # the old placement is given up
    (deployed,) = story.deploy(epoch=2)
    assert isinstance(deployed, JobDeploying) and deployed.attempt == 2
    assert story.current.transitions[-1].attempt == 2


@pytest.mark.parametrize("state", RUNNING)
def test_a_running_job_can_be_restarted_from_any_phase(state: JobStatus) -> None:
    story = story_in(state)
    story.restart()
    assert (story.current.state, story.current.attempt) == (S.QUEUED, 2)


@pytest.mark.parametrize("state", [S.QUEUED, *TERMINAL])
def test_only_a_running_job_is_restarted(state: JobStatus) -> None:
    refused(story_in(state), lambda at: Restart("why not", at))


@pytest.mark.parametrize("max_restarts", [0, 1, 3])
def test_a_restart_beyond_the_limit_fails_the_job_and_says_why(max_restarts: int) -> None:
    story = story_in(S.PROCESSING, max_restarts=max_restarts)
    for attempt in range(2, max_restarts + 2):
        story.restart(f"crash {attempt - 1}")
        assert story.current.attempt == attempt
        story.deploy(epoch=attempt)
    (event,) = story.restart("crash again")
    assert isinstance(event, JobFailed)
    job = story.current
    assert (job.state, job.restarts, job.attempt) == (S.FAILED, max_restarts, max_restarts + 1)
    assert job.failure_reason is not None
    assert "crash again" in job.failure_reason
    assert "restart" in job.failure_reason and str(max_restarts) in job.failure_reason
    assert job.transitions[-1].reason == job.failure_reason


def test_a_preempted_job_resumes_without_spending_a_restart_and_says_why() -> None:
    story = story_in(S.PROCESSING, max_restarts=0)
    story.save_checkpoint(40, "/ckpt/40")
    for attempt in (2, 3):
        (event,) = story.do(lambda at: Restart("node drained", at, preempted=True))
        assert isinstance(event, JobRestarted) and event.preempted
        assert event.resume_from == "/ckpt/40"
        story.deploy(epoch=attempt)
    job = story.current
    assert (job.state, job.attempt, job.restarts) == (S.DEPLOYING, 3, 0)
    assert [t.reason for t in job.transitions if t.state is S.QUEUED][1:] == ["node drained"] * 2
    # A failure still counts against the limit.
    (failed,) = story.restart("crash")
    assert isinstance(failed, JobFailed)


SKIPS = [
    (S.DEPLOYING, S.PROCESSING),  # no data to download
    (S.DEPLOYING, S.STORING),
    (S.DOWNLOADING, S.STORING),
]


@pytest.mark.parametrize(("start", "phase"), SKIPS)
def test_a_phase_may_be_skipped(start: JobStatus, phase: JobStatus) -> None:
    story = story_in(start)
    story.phase(phase)
    assert [t.state for t in story.current.transitions][-2:] == [start, phase]


REVISITS = [(start, phase) for start in PHASES for phase in PHASES if ORDER[phase] <= ORDER[start]]


@pytest.mark.parametrize(("start", "phase"), REVISITS)
def test_a_phase_is_never_revisited_within_an_attempt(start: JobStatus, phase: JobStatus) -> None:
    refusal = refused(story_in(start), lambda at: EnterPhase(phase, at))
    assert phase.value in str(refusal)


@pytest.mark.parametrize("phase", PHASES)
def test_a_queued_job_enters_no_phase(phase: JobStatus) -> None:
    refused(story_in(S.QUEUED), lambda at: EnterPhase(phase, at))


@pytest.mark.parametrize("not_a_phase", [S.QUEUED, S.DEPLOYING, *TERMINAL])
def test_only_learner_phases_are_entered(not_a_phase: JobStatus) -> None:
    # Deploying, finishing and requeueing have commands of their own, with their own checks.
    refused(story_in(S.DOWNLOADING), lambda at: EnterPhase(not_a_phase, at))


def test_phases_start_over_in_a_new_attempt() -> None:
    story = story_in(S.STORING)
    story.restart()
    story.deploy(epoch=2)
    story.phase(S.DOWNLOADING)
    story.phase(S.PROCESSING)
    attempt_two = [(t.state, t.attempt) for t in story.current.transitions if t.attempt == 2]
    assert attempt_two == [(S.QUEUED, 2), (S.DEPLOYING, 2), (S.DOWNLOADING, 2), (S.PROCESSING, 2)]


@pytest.mark.parametrize("codes", [[1], [0, 1], [-9], [0, 0, 137], [255, 0]])
def test_complete_refuses_non_zero_exit_codes(codes: list[int]) -> None:
    story = story_in(S.PROCESSING)
    refusal = refused(story, lambda at: Complete(codes, at))
    assert str(next(code for code in codes if code)) in str(refusal)


@pytest.mark.parametrize("state", PHASES)
def test_complete_with_zero_exit_codes_finishes_the_job(state: JobStatus) -> None:
    story = story_in(state)
    (event,) = story.complete([0, 0, 0])
    assert isinstance(event, JobCompleted)
    assert (story.current.state, story.current.exit_codes) == (S.COMPLETED, [0, 0, 0])


@pytest.mark.parametrize("state", [S.QUEUED, S.DEPLOYING])
def test_a_job_whose_learners_never_started_does_not_complete(state: JobStatus) -> None:
    refused(story_in(state), lambda at: Complete([0], at))


def test_replay_of_the_stored_log_rebuilds_the_job() -> None:
    story = story_in(S.PROCESSING, max_restarts=1)
    story.save_checkpoint(10, "/ckpt/10")
    story.restart()
    story.deploy(epoch=2)
    story.phase(S.PROCESSING)
    story.request_checkpoint()
    story.restart()
    assert story.current.state is S.FAILED
    assert replay(story.events) == story.current
    assert replay([stored(event) for event in story.events]) == story.current
    assert isinstance(story.events[-1], JobFailed)
    assert any(isinstance(event, CheckpointSaved) for event in story.events)
    assert any(isinstance(event, JobProcessing) for event in story.events)


def test_replay_of_nothing_is_no_job() -> None:
    assert replay([]) is None


def test_evolve_refuses_events_of_a_job_that_was_never_submitted() -> None:
    with pytest.raises(ValueError, match="JobSubmitted"):
        evolve(None, JobProcessing(attempt=1, at=T0))
