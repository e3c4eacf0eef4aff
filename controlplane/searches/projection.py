"""The `searches` projection: the `searches` and `search_trials` tables, rebuilt from the search
streams, which stay the truth (a search's driver decides on its stream, never on these)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.queries import Q
from controlplane.searches.events import (
    BestUpdated,
    SearchEnded,
    SearchSubmitted,
    TrialCreated,
    TrialFailed,
    TrialPromoted,
    TrialPruned,
    TrialRungFinished,
)
from controlplane.searches.spec import searcher_for
from controlplane.searches.streams import CATEGORY, search_id_of
from controlplane.searches.trials import TrialState


class SearchesProjection:
    name = "searches"
    tables: Sequence[str] = ("searches", "search_trials")
    categories: frozenset[str] | None = frozenset({CATEGORY})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        for recorded in events:
            search_id = search_id_of(recorded.stream_id)
            match recorded.event:
                case SearchSubmitted(spec=spec) as submitted:
                    await conn.execute(
                        Q["insert_search"],
                        search_id,
                        submitted.tenant,
                        spec.name,
                        spec.searcher.name,
                        spec.metric.name,
                        spec.metric.mode,
                        spec.max_trials,
                        len(searcher_for(spec).rungs),
                        spec.model_dump_json(),
                        json.dumps(spec.labels),
                        submitted.at,
                    )
                case TrialCreated() as created:
                    await conn.execute(
                        Q["insert_trial"],
                        search_id,
                        created.number,
                        created.job_id,
                        created.budget,
                        json.dumps(created.point),
                        created.parent,
                        created.reason,
                        created.at,
                    )
                case TrialPromoted() as promoted:
                    await conn.execute(
                        Q["promote_trial"],
                        search_id,
                        promoted.number,
                        promoted.job_id,
                        promoted.rung,
                        promoted.budget,
                        promoted.reason,
                        promoted.at,
                    )
                case TrialRungFinished() as finished:
                    await conn.execute(
                        Q["finish_rung"],
                        search_id,
                        finished.number,
                        finished.rung,
                        finished.metric,
                        finished.at,
                    )
                case TrialFailed() | TrialPruned() as ended:
                    state = (
                        TrialState.FAILED if isinstance(ended, TrialFailed) else TrialState.PRUNED
                    )
                    await conn.execute(
                        Q["end_trial"], search_id, ended.number, state.value, ended.reason, ended.at
                    )
                case BestUpdated() as best:
                    await conn.execute(
                        Q["update_best"], search_id, best.number, best.rung, best.metric, best.at
                    )
                case SearchEnded() as end:
                    await conn.execute(Q["end_search"], search_id, end.state, end.reason, end.at)
