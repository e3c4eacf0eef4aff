"""What a user asks for when submitting a search: a trial template (a job manifest, as a user
may write one), a search space, a searcher, the metric and its mode, the budget and the limits.
Validated in full before anything is written; unknown fields are refused.

Each trial is a job made from the template, its hyperparameters given to its learners (the
point as JSON in TRAINYARD_HPARAMS and in a file, the budget in TRAINYARD_BUDGET): names a
manifest may not set (TRAINYARD_*), so a tenant's template cannot forge them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane.jobs.manifest import (
    MAX_ENV_VALUE_CHARS,
    MAX_LABELS,
    JobManifest,
    stored_manifest,
)
from controlplane.searches.searchers import Asha, Evolution, GridSearch, RandomSearch, Searcher
from controlplane.searches.space import Space, grid_size, max_point_chars
from controlplane.searches.space import within_bounds as space_within_bounds
from controlplane.searches.trials import Mode

MAX_TRIALS = 10_000
MAX_CONCURRENT = 1_000
MAX_BUDGET = 10**9
MAX_SEED = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Metric(_Strict):
    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$",
        description="the metric the learners report (runners.metrics.log), e.g. accuracy",
    )
    mode: Mode = Field(description="max: higher is better; min: lower is")


class Budget(_Strict):
    unit: Literal["steps", "epochs"] = Field(
        description="what the learners count as they report: the `step` of their metrics"
    )
    max: int = Field(ge=1, le=MAX_BUDGET, description="a trial's whole budget")


class RandomSpec(_Strict):
    name: Literal["random"]
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


class GridSpec(_Strict):
    name: Literal["grid"]
    points: int = Field(
        default=3,
        ge=2,
        le=16,
        description=f"values of each real parameter (the grid: at most {MAX_TRIALS} points)",
    )


class AshaSpec(_Strict):
    name: Literal["asha"]
    min_budget: int = Field(
        ge=1, le=MAX_BUDGET, description="rung 0's budget: less than the search's budget.max"
    )
    reduction: int = Field(default=3, ge=2, le=8, description="1/reduction of a rung go on")
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


class EvolutionSpec(_Strict):
    name: Literal["evolution"]
    population: int = Field(default=20, ge=2, le=MAX_TRIALS)
    sample: int = Field(default=5, ge=1, le=MAX_TRIALS, description="at most population")
    seed: int = Field(default=0, ge=0, le=MAX_SEED)

    @model_validator(mode="after")
    def _sample_within(self) -> EvolutionSpec:
        if self.sample > self.population:
            raise ValueError("sample must be at most population")
        return self


SearcherSpec = Annotated[
    RandomSpec | GridSpec | AshaSpec | EvolutionSpec, Field(discriminator="name")
]


def _trial_schema(schema: dict[str, Any]) -> None:
    """What `_consistent` checks of a trial template that a schema can state: a job manifest
    with these fields null, and fewer labels."""
    schema["allOf"] = [
        {"$ref": schema.pop("$ref")},
        {
            "properties": {
                **{field: {"type": "null"} for field in TRIAL_NULL_FIELDS},
                "labels": {"maxProperties": MAX_LABELS - 2},
            }
        },
    ]


TRIAL_NULL_FIELDS = ("servable", "inference", "trial", "hparams")
"""A trial template's fields the search owns (hparams, trial) or a training job has none of."""


class SearchSpec(_Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    trial: JobManifest = Field(
        description="the template each trial's job is made from: a training job (no "
        "servable, inference, trial or hparams: the search sets each trial's), with at most "
        f"{MAX_LABELS - 2} labels (a trial's job gets two more: its search and its number)",
        json_schema_extra=_trial_schema,
    )
    space: Space = Field(
        description="the hyperparameters; a point of it takes at most "
        f"{MAX_ENV_VALUE_CHARS} characters as JSON (a learner is given it in its environment)"
    )
    searcher: SearcherSpec
    metric: Metric
    budget: Budget
    max_trials: int = Field(ge=1, le=MAX_TRIALS)
    max_concurrent_trials: int = Field(default=1, ge=1, le=MAX_CONCURRENT)
    max_failed_trials: int = Field(
        default=0, ge=0, le=MAX_TRIALS, description="failed trials tolerated; one more fails it"
    )
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)

    @model_validator(mode="after")
    def _consistent(self) -> SearchSpec:
        if self.trial.servable is not None or self.trial.inference is not None:
            raise ValueError("trial: a trial is a training job (no servable, no inference)")
        if self.trial.trial is not None or self.trial.hparams is not None:
            raise ValueError("trial: the search sets each trial's hyperparameters (hparams) itself")
        if len(self.trial.labels) > MAX_LABELS - 2:
            raise ValueError(
                f"trial.labels: at most {MAX_LABELS - 2} (a trial's job gets two more: its "
                "search and its number)"
            )
        most = max_point_chars(self.space)
        if most > MAX_ENV_VALUE_CHARS:
            raise ValueError(
                f"space: a point may take {most} characters as JSON; a learner is given at most "
                f"{MAX_ENV_VALUE_CHARS} (fewer, or shorter, parameters)"
            )
        searcher = self.searcher
        if isinstance(searcher, AshaSpec) and searcher.min_budget >= self.budget.max:
            raise ValueError("searcher.min_budget must be less than budget.max")
        if isinstance(searcher, GridSpec) and grid_size(self.space, searcher.points) > MAX_TRIALS:
            raise ValueError(f"the grid has more than {MAX_TRIALS} points")
        return self


def stored_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec stored by an older version (SearchSubmitted version 1, the searches projection's
    rows) with its trial's quantities and its log-uniform bounds raised to today's floors, so
    that the search still reads (its trials' jobs read so too: JobSubmitted version 3)."""
    if isinstance(spec.get("trial"), dict):
        spec = {**spec, "trial": stored_manifest(spec["trial"])}
    if isinstance(spec.get("space"), dict):
        spec = {**spec, "space": space_within_bounds(spec["space"])}
    return spec


def searcher_for(spec: SearchSpec) -> Searcher:
    """The pure searcher a search runs."""
    match spec.searcher:
        case RandomSpec(seed=seed):
            return RandomSearch(spec.space, spec.budget.max, seed)
        case GridSpec(points=points):
            return GridSearch(spec.space, spec.budget.max, points)
        case AshaSpec(min_budget=least, reduction=reduction, seed=seed):
            return Asha(spec.space, spec.metric.mode, least, spec.budget.max, reduction, seed)
        case EvolutionSpec(population=population, sample=drawn, seed=seed):
            return Evolution(spec.space, spec.metric.mode, spec.budget.max, population, drawn, seed)
