"""The Python SDK: a control plane's jobs, logs and nodes, its model repository, and the models
it serves (deployments, pipelines and their tasks), as method calls.

`AsyncClient` is the SDK for asyncio code, and what the CLI's user commands are built on;
`Client` is the same calls, blocking, for scripts and notebooks: it runs an `AsyncClient` on an
event loop of its own, in a thread, so it works where a loop is already running (Jupyter) too.

`Client` writes none of the calls again. Each of its methods is one line, `name =
_blocking(AsyncClient.name)` (`_iterating` for a stream): a wrapper that runs the coroutine on
the client's loop (or iterates the async generator there), given `AsyncClient`'s name,
docstring and signature for `help()`, `inspect` and IDEs. The wrappers' ParamSpec carries each
method's parameters to mypy, so strict checking sees `Client.deploy` as fully typed as
`AsyncClient.deploy`: a generic `__getattr__` would lose the types, and a stub would be the
second copy this avoids. The one line per method is a name, not a contract; a test checks that
`Client` has every public method of `AsyncClient`, with its signature.
Jobs, nodes, log lines, models and their versions are the API's JSON objects, as dicts. Errors
are exceptions: `NotFound`, `ApiError` (with the HTTP status), `ServerUnreachable`,
`UsageError`.

Model versions are named as people write them: `name` (its latest version), `name:3`,
`name@production`, each `tenant/`-prefixed for another tenant's public model. The serving calls
take `tenant=`, the tenant the admin acts for (a tenant's token acts as its own tenant).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import itertools
import os
import re
import threading
import typing
import uuid
from collections.abc import (
    AsyncGenerator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import aclosing
from datetime import datetime
from pathlib import Path
from types import GenericAlias, TracebackType
from typing import Any, BinaryIO, Concatenate, Literal, ParamSpec, TypeVar
from urllib.parse import quote

import aiohttp

from controlplane.deployments.errors import InvalidRequest
from controlplane.deployments.names import check_name
from controlplane.jobs.lifecycle import JobStatus
from controlplane.models.errors import InvalidModel
from controlplane.models.names import LATEST, check_alias
from controlplane.models.references import Reference, parse_reference
from trainyard.api import (
    ApiClient,
    ApiError,
    PredictionFailed,
    ServerUnreachable,
    UsageError,
    lines,
    sse_messages,
)

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])

Visibility = Literal["private", "public"]
"""Who may see a model version: its tenant only, or every tenant."""
DOWNLOAD_CHUNK = 1024 * 1024

TERMINAL_STATES = frozenset(status.value for status in JobStatus if status.terminal)
"""The states a job ends in: it never leaves them."""

TASK_FINISHED = frozenset({"succeeded", "failed"})
"""The states a serving task ends in: it never leaves them."""
TASK_POLL_S = (0.1, 0.2, 0.5, 1.0)
"""The pauses between reads of a task whose stream could not be followed, the last repeated."""

_TEXT_LOG = re.compile(r"\[attempt (\d+) learner (\d+) (\w+)\] (.*)", re.DOTALL)
"""A line of the API's plain-text logs: `[attempt A learner L STREAM] TEXT`."""


class AsyncClient:
    """One server, one bearer token, one HTTP session: `async with AsyncClient(server, token)
    as client: job = await client.submit(manifest)`."""

    def __init__(self, server: str, token: str) -> None:
        """`server` is the control plane's URL (`http://host:8080`), `token` a tenant's token."""
        self.api = ApiClient(server, token)
        """The HTTP API itself, for what has no method here (`request`, `follow`)."""

    @property
    def server(self) -> str:
        return self.api.server

    async def __aenter__(self) -> AsyncClient:
        await self.api.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.api.__aexit__(kind, exc, tb)

    async def submit(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Submit a job (a manifest as `trainyard.read_manifest` gives it); the new job. Its
        `unschedulable_reason`, when set, says why no node could run it now."""
        job: dict[str, Any] = await self.api.request("POST", "/v1/jobs", body=dict(manifest))
        return job

    async def jobs(
        self,
        *,
        states: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Up to `limit` (1 to 500) jobs, newest first: in any of `states` if given, and with
        every one of `labels`."""
        params = [("limit", str(limit)), *(("state", state) for state in states)]
        params += [("label", f"{key}={value}") for key, value in (labels or {}).items()]
        page = await self.api.request("GET", "/v1/jobs", params=params)
        jobs: list[dict[str, Any]] = page["jobs"]
        return jobs

    async def job(self, job_id: str) -> dict[str, Any]:
        """A job now: state, attempt, restarts, nodes, GPUs, last checkpoint, exit codes."""
        job: dict[str, Any] = await self.api.request(
            "GET", f"/v1/jobs/{job_id}", not_found=_no_job(job_id)
        )
        return job

    async def history(self, job_id: str) -> dict[str, Any]:
        """A job's history: `history`, every event with time, actor and reason; `webhooks`, its
        notifications' deliveries (absent from servers older than webhooks)."""
        history: dict[str, Any] = await self.api.request(
            "GET", f"/v1/jobs/{job_id}/history", not_found=_no_job(job_id)
        )
        return history

    async def pending(
        self, job_id: str, since: datetime | None = None, until: datetime | None = None
    ) -> dict[str, Any]:
        """Why a job is pending: `reasons` holding it now (each with `blocking`, `never` or
        `waiting`, and `detail`), its queue `position`, its `history` of reasons, and
        `seconds`, each reason's time holding it within [since, until]."""
        params = [(name, at.isoformat()) for name, at in (("since", since), ("until", until)) if at]
        view: dict[str, Any] = await self.api.request(
            "GET", f"/v1/jobs/{job_id}/pending", params=params, not_found=_no_job(job_id)
        )
        return view

    async def cancel(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel a job that has not finished (`reason` goes into its history); the job."""
        body = {"reason": reason} if reason else {}
        job: dict[str, Any] = await self.api.request(
            "POST", f"/v1/jobs/{job_id}/cancel", body=body, not_found=_no_job(job_id)
        )
        return job

    async def checkpoint(self, job_id: str) -> dict[str, Any]:
        """Ask a PROCESSING job's learners to save a checkpoint now; the job."""
        job: dict[str, Any] = await self.api.request(
            "POST", f"/v1/jobs/{job_id}/checkpoint", not_found=_no_job(job_id)
        )
        return job

    async def nodes(self) -> list[dict[str, Any]]:
        """Every node: state, whether it is draining, lease, GPUs (free ones too), CPUs and
        memory allocated."""
        nodes: list[dict[str, Any]] = (await self.api.request("GET", "/v1/nodes"))["nodes"]
        return nodes

    async def drain_node(self, node: str, reason: str | None = None) -> dict[str, Any]:
        """Take a node out of service (the admin's token): nothing new is placed on it, and
        its jobs are preempted (their learners asked to checkpoint; no restart spent) and go
        back to the queue; `reason` goes into its history. The node."""
        body = {"reason": reason} if reason else {}
        drained: dict[str, Any] = await self.api.request(
            "POST", f"/v1/nodes/{quote(node, safe='')}/drain", body=body, not_found=_no_node(node)
        )
        return drained

    async def undrain_node(self, node: str) -> dict[str, Any]:
        """Put a drained node back in service (the admin's token); the node."""
        undrained: dict[str, Any] = await self.api.request(
            "POST", f"/v1/nodes/{quote(node, safe='')}/undrain", not_found=_no_node(node)
        )
        return undrained

    async def scheduling_policy(self) -> dict[str, Any]:
        """The claim policy in force: `order` (fair_share, priority or fifo) and `quotas`
        (whether tenants' GPU quotas hold), with who set it when and why (`set_by`, `set_at`,
        `reason`: null while the default, fair share within quotas, holds)."""
        policy: dict[str, Any] = await self.api.request("GET", "/v1/scheduling/policy")
        return policy

    async def set_scheduling_policy(
        self, order: str, *, quotas: bool = True, reason: str | None = None
    ) -> dict[str, Any]:
        """Switch the claim policy (the admin's token): claims take queued jobs in `order`
        (fair_share, priority or fifo), within tenants' GPU quotas or not (`quotas`), from the
        next claim on; `reason` is recorded with it. The policy in force, `changed` false when
        it was in force already (nothing written). Try one against the recorded past first:
        `trainyard simulate --policy-file FILE`."""
        body: dict[str, Any] = {"order": order, "quotas": quotas}
        if reason:
            body["reason"] = reason
        policy: dict[str, Any] = await self.api.request("PUT", "/v1/scheduling/policy", body=body)
        return policy

    async def events(self, job_id: str) -> AsyncGenerator[dict[str, Any], None]:
        """A job's events (type, state, attempt, data), from its submission on, as they
        happen; the iteration ends with the event that ends the job. A dropped connection is
        resumed where it broke."""
        stream = self.api.follow(f"/v1/jobs/{job_id}/events", not_found=_no_job(job_id))
        async with aclosing(stream):
            async for message in stream:
                event: dict[str, Any] = message.json()
                yield event
                if event["state"] in TERMINAL_STATES:
                    return

    async def wait(self, job_id: str) -> str:
        """Wait for a job to end; the state it ended in (COMPLETED, FAILED or CANCELLED)."""
        state = ""
        async with aclosing(self.events(job_id)) as events:
            async for event in events:
                state = event["state"]
        return state

    async def logs(
        self,
        job_id: str,
        *,
        follow: bool = False,
        attempt: int | None = None,
        learner: int | None = None,
        protocol: bool = False,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """A job's learner log lines, in the order stored, each {attempt, learner, stream,
        line} (and, when following, its `seq` and `at`); only attempt `attempt` or learner
        `learner` if given, and the launcher's reports (protocol lines) too with `protocol`.
        Without `follow`, the lines stored so far; with it, new ones as they come, until the job
        and its learners have ended."""
        params = [("protocol", "true")] if protocol else []
        if attempt is not None:
            params.append(("attempt", str(attempt)))
        if learner is not None:
            params.append(("learner", str(learner)))
        path, not_found = f"/v1/jobs/{job_id}/logs", _no_job(job_id)
        if not follow:
            text = await self.api.request(
                "GET", path, params=params, not_found=not_found, text=True
            )
            for stored in _text_lines(text):
                yield stored
            return
        stream = self.api.follow(path, [("follow", "true"), *params], not_found=not_found)
        async with aclosing(stream):
            async for message in stream:
                if message.event == "end":
                    return
                if message.event == "line":
                    line: dict[str, Any] = message.json()
                    yield line

    async def grep(
        self,
        pattern: str,
        *,
        regex: bool = False,
        ignore_case: bool = False,
        jobs: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        since: datetime | None = None,
        follow: bool = False,
        protocol: bool = False,
        tenant: str | None = None,
        page_size: int = 100,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The lines of all the tenant's jobs and attempts that hold `pattern` (a Postgres
        regular expression with `regex`), each {job_id, attempt, learner, stream, seq, id, at,
        line}: without `follow`, every match newest first (page by page, as the iteration goes);
        with it, only new matches, oldest first, as they come, for ever (resumed where it broke
        when the connection drops). Only the jobs `jobs`, those with every one of `labels`, and
        lines printed at or after `since`, when given; the admin names the `tenant`."""
        params = [("pattern", pattern), *_acting(tenant)]
        flags = (("regex", regex), ("ignore_case", ignore_case), ("protocol", protocol))
        params += [(name, "true") for name, on in flags if on]
        params += [("job", job) for job in jobs]
        params += [("label", f"{key}={value}") for key, value in (labels or {}).items()]
        if since is not None:
            params.append(("since", since.isoformat()))
        if follow:
            stream = self.api.follow("/v1/logs/search", [*params, ("follow", "true")])
            async with aclosing(stream):
                async for message in stream:
                    if message.event == "error":
                        raise ApiError(400, message.json()["error"])
                    if message.event == "line":
                        line: dict[str, Any] = message.json()
                        yield line
            return
        cursor: str | None = None
        while True:
            paging = [("limit", str(page_size)), *([("cursor", cursor)] if cursor else [])]
            page = await self.api.request("GET", "/v1/logs/search", params=params + paging)
            for found in page["lines"]:
                yield found
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def models(
        self, query: str = "", *, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page of the model versions that `query` matches (docs/user-guide.md, "Model search
        queries"; "" matches every one the caller may see), best first: `versions`, `total` (of
        all the matches), `facets` (their counts by framework, domain, tenant and license) and
        `next_cursor` (None on the last page), to pass as `cursor`. `limit` is 1 to 200. A
        query the server cannot read is ApiError (400) saying what is wrong, and where."""
        params = [("q", query), ("limit", str(limit))]
        if cursor is not None:
            params.append(("cursor", cursor))
        page: dict[str, Any] = await self.api.request("GET", "/v1/models", params=params)
        return page

    async def model(self, reference: str) -> dict[str, Any]:
        """A model (`name`, or `tenant/name`): the versions the caller may see, newest first,
        its `aliases` (alias: version number) and its `latest` version's number."""
        ref = _model_reference(reference)
        model: dict[str, Any] = await self.api.request("GET", _model_path(ref), params=_owner(ref))
        return model

    async def model_version(self, reference: str) -> dict[str, Any]:
        """The model version `reference` names (`[tenant/]name[:N|@alias]`; without a version
        or alias, the latest): its metadata, artifact sha256 and size, visibility and
        deprecation."""
        ref = _reference(reference)
        version: dict[str, Any] = await self.api.request(
            "GET", _version_path(ref), params=_owner(ref)
        )
        return version

    async def publish_model(
        self,
        name: str,
        artifact: str | os.PathLike[str],
        metadata: Mapping[str, Any],
        *,
        visibility: Visibility = "private",
    ) -> dict[str, Any]:
        """Publish the file `artifact` as the next version of model `name` (`tenant/name`:
        the admin, publishing for a tenant), with the metadata document `metadata`; the new
        version. The file is streamed, never held in memory whole; its sha256, computed first,
        goes with it, and the server keeps nothing unless the bytes it received hash to that.
        Publishing the same file with the same metadata again answers the version it made."""
        ref = _model_reference(name)
        path = Path(artifact)
        try:
            file, sha256 = await asyncio.to_thread(_opened_with_sha256, path)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc}") from exc
        with file:
            form = aiohttp.MultipartWriter("form-data")
            # The server reads the publication first, and refuses a bad one before it stores
            # a byte of the artifact, which must come second.
            publication = {"metadata": dict(metadata), "visibility": visibility, "sha256": sha256}
            form.append_json(publication).set_content_disposition("form-data", name="publication")
            part = form.append(file, {"Content-Type": "application/octet-stream"})
            part.set_content_disposition("form-data", name="artifact", filename=path.name)
            version: dict[str, Any] = await self.api.request(
                "POST", f"{_model_path(ref)}/versions", params=_owner(ref), form=form
            )
        return version

    async def publish_model_from_job(
        self,
        name: str,
        job_id: str,
        metadata: Mapping[str, Any],
        *,
        checkpoint_step: int | None = None,
        results_file: str | None = None,
        visibility: Visibility = "private",
    ) -> dict[str, Any]:
        """Publish as the next version of model `name` a file of the COMPLETED job `job_id`'s
        stored results (`results_file`, relative to them; the server's default is model.pt),
        or the checkpoint the job saved at `checkpoint_step`; the new version. Nothing is
        uploaded: the control plane reads the file where the job stored it, and fills in the
        metadata's provenance (job, attempt, checkpoint step, data sha256) from the job's
        events, so `metadata` gives none."""
        ref = _model_reference(name)
        body: dict[str, Any] = {
            "metadata": dict(metadata),
            "visibility": visibility,
            "from_job": job_id,
            "checkpoint_step": checkpoint_step,
        }
        if results_file is not None:
            body["results_file"] = results_file
        version: dict[str, Any] = await self.api.request(
            "POST", f"{_model_path(ref)}/versions", params=_owner(ref), body=body
        )
        return version

    async def update_model(self, reference: str, update: Mapping[str, Any]) -> dict[str, Any]:
        """Change what may change of the version `reference` names: `update` gives any of
        `description`, `domains`, `tags`, `citation` (each replacing the version's), and
        `metrics` to add (a metric recorded already never changes: ApiError 409); the
        version."""
        ref = _reference(reference)
        version: dict[str, Any] = await self.api.request(
            "PATCH", _version_path(ref), params=_owner(ref), body=dict(update)
        )
        return version

    async def set_model_alias(self, reference: str, alias: str) -> dict[str, Any]:
        """Point the model's `alias` at the version `reference` names, setting it or moving
        it: {alias, version, previous} (`previous`: the version it named, or None)."""
        ref = _reference(reference)
        path = f"{_model_path(ref)}/aliases/{_checked(check_alias, alias)}"
        # An alias names a number, never another alias or `latest`, which move.
        number = ref.version or (await self.model_version(reference))["version"]
        moved: dict[str, Any] = await self.api.request(
            "PUT", path, params=_owner(ref), body={"version": number}
        )
        return moved

    async def remove_model_alias(self, reference: str, alias: str) -> None:
        """Remove `alias` from the model `reference` names (`[tenant/]name`)."""
        ref = _model_reference(reference)
        path = f"{_model_path(ref)}/aliases/{_checked(check_alias, alias)}"
        await self.api.request("DELETE", path, params=_owner(ref))

    async def set_model_webhook(self, reference: str, url: str) -> None:
        """Notify the events of the model `reference` names (`name`) to `url` from now on:
        versions published, updated or deprecated, aliases set or removed, each POSTed and
        signed as a job's notifications are."""
        ref = _model_reference(reference)
        path = f"{_model_path(ref)}/webhook"
        await self.api.request("PUT", path, params=_owner(ref), body={"url": url})

    async def remove_model_webhook(self, reference: str) -> None:
        """Stop notifying the model's events (nothing to stop is fine too)."""
        ref = _model_reference(reference)
        await self.api.request("DELETE", f"{_model_path(ref)}/webhook", params=_owner(ref))

    async def deprecate_model(self, reference: str, reason: str) -> dict[str, Any]:
        """Deprecate the version `reference` names, saying why: it stays downloadable by
        reference, but is no longer `latest`; the version. One an alias names is refused
        (ApiError 409): move the alias first."""
        ref = _reference(reference)
        version: dict[str, Any] = await self.api.request(
            "POST", f"{_version_path(ref)}/deprecate", params=_owner(ref), body={"reason": reason}
        )
        return version

    async def download_model(self, reference: str, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Download the artifact of the version `reference` names to the file `path`,
        replacing any file there; the version. The bytes go to a temporary file beside `path`,
        renamed onto it only once their size and sha256 are the version's: a download that
        breaks off or arrives corrupted leaves `path` as it was."""
        ref = _reference(reference)
        target = Path(path)
        if await asyncio.to_thread(target.is_dir):
            raise UsageError(f"{target} is a directory: name the file to write")
        version = await self.model_version(reference)
        # Its number, not `reference`: the bytes must be this version's even if an alias or
        # `latest` moves meanwhile.
        artifact = f"{_model_path(ref)}/versions/{version['version']}/artifact"
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        digest, received = hashlib.sha256(), 0
        try:
            try:
                file = await asyncio.to_thread(_created, temporary)
            except OSError as exc:
                raise UsageError(f"cannot write {target}: {exc}") from exc
            with file:
                async with self.api.download(artifact, _owner(ref)) as response:
                    status = response.status
                    async for chunk in response.content.iter_chunked(DOWNLOAD_CHUNK):
                        await asyncio.to_thread(_append, file, digest.update, chunk)
                        received += len(chunk)
                await asyncio.to_thread(_make_durable, file)
            expected = (version["size_bytes"], version["artifact_sha256"])
            if (received, digest.hexdigest()) != expected:
                raise ApiError(
                    status,
                    f"the artifact of {version['reference']} arrived corrupted ({received} "
                    f"bytes, sha256 {digest.hexdigest()}; the version's are {expected[0]} "
                    f"bytes, sha256 {expected[1]}); nothing was written to {target}",
                )
            os.replace(temporary, target)
        except ServerUnreachable as exc:
            # A dropped connection, or a server that found the stored bytes damaged and
            # stopped: the client cannot tell which.
            raise ServerUnreachable(
                f"the download of {version['reference']} broke off before its end "
                f"({exc.__cause__ or exc}); nothing was written to {target}"
            ) from exc
        finally:
            temporary.unlink(missing_ok=True)
        return version

    async def deploy(
        self,
        name: str,
        model: str,
        *,
        replicas: int | None = None,
        gpus: int | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
        image: str | None = None,
        max_batch_size: int | None = None,
        max_wait_ms: float | None = None,
        memo: bool | None = None,
        memo_max_entries: int | None = None,
        task_timeout_s: float | None = None,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        target_in_flight: float | None = None,
        scale_down_delay_s: float | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Serve the model version `model` names (`[tenant/]name[:N|@alias]`, resolved once,
        now) as deployment `name`, on `replicas` replicas, each holding `gpus`, `cpus` and
        `memory_mb` (in `image`, the Docker runtime's); the new deployment, its replica jobs
        asked for. A call of the entry point gets up to `max_batch_size` items, its batch
        waiting up to `max_wait_ms` for more after the first; `memo` answers an input seen
        before from the `memo_max_entries` results kept; a replica holding a task longer than
        `task_timeout_s` is replaced, and the task retried. Autoscaled instead of `replicas`
        (any of the four given; `max_replicas` then required): between `min_replicas` (0:
        scaled to zero when idle) and `max_replicas`, as many as the requests in flight need at
        `target_in_flight` each, fewer only `scale_down_delay_s` after the last change. Each
        setting left None is not sent: the server decides it, and the deployment returned
        shows what it chose."""
        resources = _given(gpus=gpus, cpus=cpus, memory_mb=memory_mb, image=image)
        autoscaling = _given(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_in_flight=target_in_flight,
            scale_down_delay_s=scale_down_delay_s,
        )
        serving = _given(
            max_batch_size=max_batch_size,
            max_wait_ms=max_wait_ms,
            memo=memo,
            memo_max_entries=memo_max_entries,
            task_timeout_s=task_timeout_s,
        )
        body = _given(
            name=name,
            model=model,
            replicas=replicas,
            resources=resources,
            serving=serving,
            autoscaling=autoscaling or None,
        )
        deployment: dict[str, Any] = await self.api.request(
            "POST", "/v1/deployments", params=_acting(tenant), body=body
        )
        return deployment

    async def deployments(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        """Every deployment: name, model version, replicas asked for, replica jobs, state
        (`serving`, or `deleting` while its replicas stop)."""
        page = await self.api.request("GET", "/v1/deployments", params=_acting(tenant))
        deployments: list[dict[str, Any]] = page["items"]
        return deployments

    async def deployment(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        """A deployment: its model version (reference, artifact sha256, entry point), replicas,
        resources, serving settings, state, and each replica job's state and attempt."""
        deployment: dict[str, Any] = await self.api.request(
            "GET", _deployment_path(name), params=_acting(tenant)
        )
        return deployment

    async def deployment_history(
        self, name: str, *, tenant: str | None = None
    ) -> list[dict[str, Any]]:
        """Every event of deployment `name`, oldest first: version, position, event, at, actor,
        data (each change of its replicas among them, an autoscaled one with the load that
        drove it), read page after page."""
        history: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            params = [("after", str(after)), *_acting(tenant)]
            page = await self.api.request("GET", f"{_deployment_path(name)}/history", params=params)
            history.extend(page["history"])
            after = page["next_after"]
        return history

    async def scale(self, name: str, replicas: int, *, tenant: str | None = None) -> dict[str, Any]:
        """Serve deployment `name` on `replicas` replicas (0 keeps it, serving nothing); the
        deployment."""
        deployment: dict[str, Any] = await self.api.request(
            "PATCH", _deployment_path(name), params=_acting(tenant), body={"replicas": replicas}
        )
        return deployment

    async def autoscale(
        self,
        name: str,
        *,
        max_replicas: int,
        min_replicas: int | None = None,
        target_in_flight: float | None = None,
        scale_down_delay_s: float | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Make deployment `name`'s replicas follow its load (or change its bounds): between
        `min_replicas` and `max_replicas`, as many as its requests in flight need at
        `target_in_flight` each (see `deploy`); the deployment. Each setting left None is the
        server's default."""
        body = _given(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_in_flight=target_in_flight,
            scale_down_delay_s=scale_down_delay_s,
        )
        deployment: dict[str, Any] = await self.api.request(
            "PUT", f"{_deployment_path(name)}/autoscaling", params=_acting(tenant), body=body
        )
        return deployment

    async def stop_autoscaling(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        """Turn deployment `name`'s autoscaling off: its replicas stay what they are now, a
        fixed number (`scale` changes it); the deployment."""
        deployment: dict[str, Any] = await self.api.request(
            "DELETE", f"{_deployment_path(name)}/autoscaling", params=_acting(tenant)
        )
        return deployment

    async def set_canary(
        self,
        name: str,
        model: str,
        weight: int,
        *,
        replicas: int | None = None,
        max_error_rate: float | None = None,
        min_requests: int | None = None,
        window_s: float | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Serve `model` (another version of deployment `name`'s model, as `name:3`) beside it
        on `replicas` replicas of its own, taking `weight` percent (0 to 100) of its requests;
        again, its weight moves. With `max_error_rate`, it rolls back by itself once more than
        that share of its requests failed (of at least `min_requests` in the last `window_s`
        seconds). The deployment, its `canary` with it. Each setting left None is the
        server's default."""
        body: dict[str, Any] = {"model": model, "weight": weight, **_given(replicas=replicas)}
        if max_error_rate is not None:
            body["rollback"] = _given(
                max_error_rate=max_error_rate, min_requests=min_requests, window_s=window_s
            )
        deployment: dict[str, Any] = await self.api.request(
            "PUT", f"{_deployment_path(name)}/canary", params=_acting(tenant), body=body
        )
        return deployment

    async def promote_canary(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        """Make deployment `name`'s canary its version: every request to it, the old version's
        replicas stopped; the deployment."""
        deployment: dict[str, Any] = await self.api.request(
            "POST", f"{_deployment_path(name)}/canary/promote", params=_acting(tenant)
        )
        return deployment

    async def roll_back_canary(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        """Roll deployment `name`'s canary back: its replicas stopped, every request to the
        deployment's own version; the deployment."""
        deployment: dict[str, Any] = await self.api.request(
            "DELETE", f"{_deployment_path(name)}/canary", params=_acting(tenant)
        )
        return deployment

    async def undeploy(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        """Delete deployment `name`: it takes no more tasks and its replicas stop; the
        deployment, `deleting`."""
        deployment: dict[str, Any] = await self.api.request(
            "DELETE", _deployment_path(name), params=_acting(tenant)
        )
        return deployment

    async def deployment_metrics(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        """A deployment's figures, over the tasks and batches kept: requests and outcomes,
        queue depth, memo hits and misses, batch sizes and why batches left, latencies (p50,
        p99)."""
        figures: dict[str, Any] = await self.api.request(
            "GET", f"{_deployment_path(name)}/metrics", params=_acting(tenant)
        )
        return figures

    async def predict(
        self,
        deployment: str,
        inputs: Sequence[Any],
        *,
        asynchronous: bool = False,
        no_cache: bool = False,
        pipeline: bool = False,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Run deployment `deployment`'s model (with `pipeline`, the pipeline's deployments in
        order) on `inputs`, a list of items, each one input (DLHub's `run`); the task, finished:
        `status` `succeeded` with `outputs` (one per item) or `failed` with `error`, `memo`
        (`hit`, `miss`, `off`) and `times` (request, invocation, inference and each step's).
        With `asynchronous`, the task at once, `queued` (`task_id`: see `task`, `wait_task`)
        unless the memo answered it. `no_cache` runs the model even on an input the memo
        holds. A result that takes longer than the server waits is waited for here."""
        path = _pipeline_path(deployment) if pipeline else _deployment_path(deployment)
        body = {"inputs": list(inputs), "async": asynchronous, "no_cache": no_cache}
        task: dict[str, Any] = await self.api.request(
            "POST", f"{path}/predict", params=_acting(tenant), body=body
        )
        if asynchronous or task["status"] in TASK_FINISHED:
            return task
        # 202: the server stopped waiting for the result; the task goes on.
        return await self.wait_task(task["task_id"], tenant=tenant)

    async def stream_predict(
        self, deployment: str, inputs: Sequence[Any], *, tenant: str | None = None
    ) -> AsyncGenerator[Any, None]:
        """Run deployment `deployment`'s streaming model (its entry point a generator
        function) on `inputs`, a list of exactly one item, and yield each output as the model
        yields it. Never batched, never memoized; counted as a task. PredictionFailed (its
        `task_id` and `chunks` sent) when the stream ends with an error (the model raised, its
        replica was lost, it went quiet past the deployment's task timeout); ApiError 409 for a
        model that does not stream, 503 when no replica can take a stream now (retry).
        Stopping the iteration early (or closing it) stops the model at its next output."""
        path = f"{_deployment_path(deployment)}/predict/stream"
        body = {"inputs": list(inputs)}
        async with self.api.post_stream(path, _acting(tenant), body) as response:
            async for message in sse_messages(lines(response.content)):
                if message.event == "output":
                    yield message.json()
                elif message.event == "done":
                    return
                elif message.event == "error":
                    ended = message.json()
                    raise PredictionFailed(ended["error"], ended["task_id"], ended["chunks"])
        raise ServerUnreachable(
            f"the stream from {self.server} ended before its last event (the server stopped)"
        )

    async def task(self, task_id: str, *, tenant: str | None = None) -> dict[str, Any]:
        """A task now: `status` (`queued`, `running`, `succeeded`, `failed`), its outputs or
        error once finished, memo, tries and times."""
        task: dict[str, Any] = await self.api.request(
            "GET", _task_path(task_id), params=_acting(tenant)
        )
        return task

    async def cancel_task(self, task_id: str, *, tenant: str | None = None) -> dict[str, Any]:
        """Cancel a task not yet finished: the task, `failed` with the error `cancelled by its
        owner` (a call of its replica's already running finishes; its result is not kept).
        ApiError 409 once it has finished."""
        task: dict[str, Any] = await self.api.request(
            "POST", f"{_task_path(task_id)}/cancel", params=_acting(tenant)
        )
        return task

    async def wait_task(
        self, task_id: str, timeout_s: float | None = None, *, tenant: str | None = None
    ) -> dict[str, Any]:
        """Wait for a task to finish; the task (see `task`), `succeeded` or `failed`. Its stream
        says when; a stream refused (429: the tenant's live streams at their limit) or broken
        off is replaced by reading the task every second or so. TimeoutError after `timeout_s`
        seconds (None: no limit); the task goes on regardless."""
        path, params = _task_path(task_id), _acting(tenant)
        async with asyncio.timeout(timeout_s):
            task = await self._streamed_task(path, params)
            pauses = itertools.chain(TASK_POLL_S, itertools.repeat(TASK_POLL_S[-1]))
            while task is None or task["status"] not in TASK_FINISHED:
                await asyncio.sleep(next(pauses))
                task = await self.api.request("GET", path, params=params)
        return task

    async def _streamed_task(
        self, path: str, params: list[tuple[str, str]]
    ) -> dict[str, Any] | None:
        """The last task view the task's stream sent: the finished task, unless the stream was
        refused or broke off before (then the last one it sent, or None)."""
        task: dict[str, Any] | None = None
        try:
            # `download`: a response read as it arrives. Its stall limit (minutes) matters only
            # for a connection that died silently: the server's heartbeats keep a live one busy.
            async with self.api.download(f"{path}/events", params) as response:
                async for message in sse_messages(response.content):
                    if message.event == "status":
                        task = message.json()
        except (ApiError, ServerUnreachable):
            # Reading the task needs no stream, and reports a lasting failure (a server gone)
            # as every request does.
            pass
        return task

    async def define_pipeline(
        self, name: str, steps: Sequence[str], *, tenant: str | None = None
    ) -> dict[str, Any]:
        """Define pipeline `name`: the deployments `steps`, in order, each step's outputs the
        next one's inputs (see `predict`'s `pipeline`); the pipeline."""
        pipeline: dict[str, Any] = await self.api.request(
            "POST",
            "/v1/pipelines",
            params=_acting(tenant),
            body={"name": name, "steps": list(steps)},
        )
        return pipeline

    async def pipeline(self, name: str, *, tenant: str | None = None) -> dict[str, Any]:
        """A pipeline: its steps (deployment names, in order) and creation time."""
        pipeline: dict[str, Any] = await self.api.request(
            "GET", _pipeline_path(name), params=_acting(tenant)
        )
        return pipeline

    async def remove_pipeline(self, name: str, *, tenant: str | None = None) -> None:
        """Remove pipeline `name` (its deployments stay)."""
        await self.api.request("DELETE", _pipeline_path(name), params=_acting(tenant))

    async def infer(
        self,
        name: str,
        model: str,
        *,
        input: Mapping[str, Any],
        batch_size: int | None = None,
        queries: int | None = None,
        weight: float | None = None,
        replicas: int | None = None,
        resources: Mapping[str, Any] | None = None,
        query_timeout_s: float | None = None,
        labels: Mapping[str, str] | None = None,
        tenant: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Submit inference job `name`: the model version `model` names
        (`[tenant/]name[:N|@alias]`, resolved once, now) run over `input`, one query per batch
        of `batch_size` items; the new job (a job: `job`, `events`, `wait`, `cancel` take its
        `id`). `input` is `{"generate": {"shape": [3, 224, 224], "seed": 0}}` (generated
        items, endless unless `queries` says how many) or `{"items": [...]}` (the items
        themselves, covered once unless `queries` says fewer). `weight` is its share against
        the other inference jobs running (query throughputs go as the weights); `replicas` run
        it, each holding `resources` (`gpus`, `cpus`, `memory_mb`, `image`); a replica holding a
        query past `query_timeout_s` is replaced and the query retried. Each setting left None
        is not sent: the server decides it. A retry with the same `idempotency_key` gets the
        job the first call made, never a second."""
        body = _given(
            name=name,
            model=model,
            input=dict(input),
            batch_size=batch_size,
            queries=queries,
            weight=weight,
            replicas=replicas,
            resources=None if resources is None else dict(resources),
            query_timeout_s=query_timeout_s,
            labels=dict(labels) if labels else None,
        )
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        job: dict[str, Any] = await self.api.request(
            "POST", "/v1/inference", params=_acting(tenant), body=body, headers=headers
        )
        return job

    async def inference_stats(self, job_id: str) -> dict[str, Any]:
        """An inference job's statistics, exact, over every query recorded: `state`, `model`
        (`tenant/name:N`), `weight`, `batch_size`, `total_queries` (None: until cancelled),
        `queries` (finished, succeeded, failed, running, queued, retried), `rate` (`window_qps`
        over the last `window_s` seconds, `overall_qps`), `latency_ms` (mean, std, min, median,
        p90, p95, p99, max; None before a query has finished) and the same for each of its
        `replicas` (with `replica`, `node`, `seen_at`). NotFound for a job that is not an
        inference job."""
        figures: dict[str, Any] = await self.api.request("GET", f"{_job_path(job_id)}/stats")
        return figures

    async def follow_inference_stats(self, job_id: str) -> AsyncGenerator[dict[str, Any], None]:
        """An inference job's statistics (see `inference_stats`) now and at each change of its
        state or counts, as its SSE stream sends them; the iteration ends with the figures of
        the job ended. A dropped connection is reopened (its first figures are those of then)."""
        stream = self.api.follow(f"{_job_path(job_id)}/stats/events")
        async with aclosing(stream):
            async for message in stream:
                if message.event != "stats":
                    continue
                figures: dict[str, Any] = message.json()
                yield figures
                if figures["state"] in TERMINAL_STATES:
                    return

    async def inference_queries(
        self, job_id: str, *, after: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """An inference job's queries in order, those with an index above `after` (None: from
        the first), at most `limit` (1 to 1000; None: the server's 100): `queries`, each with
        `index`, `state`, `replica`, `node`, `tries`, times, `latency_ms`, `inference_ms`,
        `outputs` (one per item) or `error`; and `next_after` (the last index given, to pass
        as `after` for the next page; None once a page is shorter than asked for: the last,
        for now)."""
        params: list[tuple[str, str]] = []
        if after is not None:
            params.append(("after", str(after)))
        if limit is not None:
            params.append(("limit", str(limit)))
        page: dict[str, Any] = await self.api.request(
            "GET", f"{_job_path(job_id)}/queries", params=params
        )
        return page

    async def submit_search(
        self,
        spec: Mapping[str, Any],
        *,
        tenant: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Submit a search (a spec as `trainyard.read_manifest` reads a file: name, trial,
        space, searcher, metric, budget, max_trials...); the new search (`id`, `state`,
        `trials` created at once). A retry with the same `idempotency_key` gets the search the
        first call made."""
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        search: dict[str, Any] = await self.api.request(
            "POST", "/v1/searches", params=_acting(tenant), body=dict(spec), headers=headers
        )
        return search

    async def searches(self, *, state: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Up to `limit` (1 to 500) searches, newest first, in `state` if given."""
        params = [("limit", str(limit)), *((("state", state),) if state else ())]
        page = await self.api.request("GET", "/v1/searches", params=params)
        found: list[dict[str, Any]] = page["searches"]
        return found

    async def search(self, search_id: str) -> dict[str, Any]:
        """A search now: its state, trials created, best trial so far (`best`: trial, rung,
        metric), why it ended, its spec."""
        search: dict[str, Any] = await self.api.request(
            "GET", _search_path(search_id), not_found=_no_search(search_id)
        )
        return search

    async def search_trials(self, search_id: str) -> list[dict[str, Any]]:
        """Every trial of a search, by number: its rung, budget, state, hyperparameters, the
        metric at each rung it finished, and the reason for the searcher's latest decision."""
        page = await self.api.request(
            "GET", f"{_search_path(search_id)}/trials", not_found=_no_search(search_id)
        )
        trials: list[dict[str, Any]] = page["trials"]
        return trials

    async def search_best(self, search_id: str) -> dict[str, Any]:
        """The best trial so far (`trial`, `rung`, `metric`, `hparams`, `job_id`) and the job
        `manifest` that trains its model again (submit it with `submit`)."""
        best: dict[str, Any] = await self.api.request(
            "GET", f"{_search_path(search_id)}/best", not_found=_no_search(search_id)
        )
        return best

    async def cancel_search(self, search_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel a running search; its running trials' jobs are cancelled."""
        body = {"reason": reason} if reason else {}
        search: dict[str, Any] = await self.api.request(
            "POST", f"{_search_path(search_id)}/cancel", body=body, not_found=_no_search(search_id)
        )
        return search

    async def search_events(self, search_id: str) -> AsyncGenerator[dict[str, Any], None]:
        """A search's events (`type`, `data`: trials created, promoted, finished, failed,
        pruned; best updated), from its submission on, as they are recorded; the iteration
        ends with SearchEnded. A dropped connection is resumed where it broke."""
        path = f"{_search_path(search_id)}/events"
        stream = self.api.follow(path, not_found=_no_search(search_id))
        async with aclosing(stream):
            async for message in stream:
                event: dict[str, Any] = message.json()
                yield event
                if event["type"] == "SearchEnded":
                    return


def _no_job(job_id: str) -> str:
    return f"no job {job_id}"


def _no_node(node: str) -> str:
    return f"no node named {node!r}"


def _no_search(search_id: str) -> str:
    return f"no search {search_id}"


def _search_path(search_id: str) -> str:
    try:
        return f"/v1/searches/{uuid.UUID(search_id)}"
    except ValueError:
        raise UsageError(f"invalid search id {search_id[:80]!r}: a search id is a UUID") from None


def _checked(check: Callable[[str], T], text: str) -> T:
    """`check(text)`, its InvalidModel a UsageError: what the caller wrote is wrong."""
    try:
        return check(text)
    except InvalidModel as exc:
        raise UsageError(str(exc)) from None


def _reference(text: str) -> Reference:
    return _checked(parse_reference, text)


def _model_reference(text: str) -> Reference:
    """A reference to a model as a whole: without a version or alias."""
    ref = _reference(text)
    if ref.version is not None or ref.alias is not None:
        owner = f"{ref.owner}/" if ref.owner else ""
        raise UsageError(f"{text!r} names a version: name the model alone, {owner}{ref.name}")
    return ref


def _model_path(ref: Reference) -> str:
    return f"/v1/models/{ref.name}"


def _version_path(ref: Reference) -> str:
    selector = ref.alias or (LATEST if ref.version is None else str(ref.version))
    return f"{_model_path(ref)}/versions/{selector}"


def _owner(ref: Reference) -> list[tuple[str, str]]:
    """The query naming the model's tenant; none names the caller's own."""
    return [("tenant", ref.owner)] if ref.owner else []


def _acting(tenant: str | None) -> list[tuple[str, str]]:
    """The query naming the tenant the admin acts for; none: the token's own tenant."""
    return [("tenant", tenant)] if tenant else []


def _given(**settings: Any) -> dict[str, Any]:
    """The settings the caller gave: one left None is the server's to decide, so it is not
    sent."""
    return {name: value for name, value in settings.items() if value is not None}


def _serving_name(name: str) -> str:
    # Checked here: in a path, another character would name another resource.
    try:
        return check_name(name)
    except InvalidRequest as exc:
        raise UsageError(str(exc)) from None


def _deployment_path(name: str) -> str:
    return f"/v1/deployments/{_serving_name(name)}"


def _pipeline_path(name: str) -> str:
    return f"/v1/pipelines/{_serving_name(name)}"


def _job_path(job_id: str) -> str:
    # Checked here: in a path, another text would name another resource.
    try:
        return f"/v1/jobs/{uuid.UUID(job_id)}"
    except ValueError:
        raise UsageError(f"invalid job id {job_id[:80]!r}: a job id is a UUID") from None


def _task_path(task_id: str) -> str:
    try:
        return f"/v1/tasks/{uuid.UUID(task_id)}"
    except ValueError:
        raise UsageError(f"invalid task id {task_id[:80]!r}: a task id is a UUID") from None


def _opened_with_sha256(path: Path) -> tuple[BinaryIO, str]:
    """The file open at its start, and its sha256: the file hashed is the one sent, even if
    another is renamed onto its path meanwhile."""
    file = path.open("rb")
    try:
        sha256 = hashlib.file_digest(file, "sha256").hexdigest()
        file.seek(0)
    except BaseException:
        file.close()
        raise
    return file, sha256


def _created(path: Path) -> BinaryIO:
    # O_EXCL: the name is fresh, so the file is this download's alone; 0o666 less the umask,
    # as any other file the user writes.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    return os.fdopen(os.open(path, flags, 0o666), "wb")


def _append(file: BinaryIO, digest: Callable[[bytes], None], chunk: bytes) -> None:
    digest(chunk)
    file.write(chunk)


def _make_durable(file: BinaryIO) -> None:
    """On disk before the rename, so that no crash can leave a file at the path that is not
    the whole artifact."""
    file.flush()
    os.fsync(file.fileno())


def _text_lines(text: str) -> list[dict[str, Any]]:
    """The API's plain-text logs as lines: a text line without the `[attempt ...]` prefix
    continues the line before it (a learner's line with a line break in it)."""
    lines: list[dict[str, Any]] = []
    for row in text.splitlines():
        match = _TEXT_LOG.fullmatch(row)
        if match is not None:
            attempt, learner, stream, content = match.groups()
            lines.append(
                {
                    "attempt": int(attempt),
                    "learner": int(learner),
                    "stream": stream,
                    "line": content,
                }
            )
        elif lines:
            lines[-1]["line"] += "\n" + row
    return lines


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Client, P], T]:
    """`AsyncClient`'s `method` as `Client`'s: the same call, run on the client's loop, its
    result waited for."""

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self._client, *args, **kwargs))

    return _presented_as(call, method, _signature(method))


def _iterating(
    method: Callable[Concatenate[AsyncClient, P], AsyncGenerator[T, None]],
) -> Callable[Concatenate[Client, P], Iterator[T]]:
    """`AsyncClient`'s stream `method` as `Client`'s: a plain iterator over what it yields,
    each item waited for as the iteration asks; closed (or dropped) early, it closes the
    stream."""

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(method(self._client, *args, **kwargs))

    signature = _signature(method)
    item = typing.get_args(signature.return_annotation)[0]
    return _presented_as(
        call, method, signature.replace(return_annotation=GenericAlias(Iterator, (item,)))
    )


def _signature(method: Callable[..., Any]) -> inspect.Signature:
    # Evaluated: `from __future__ import annotations` leaves them strings, and a stream's
    # return type is rewritten from its item type.
    return inspect.signature(method, eval_str=True)


def _presented_as(call: F, method: Callable[..., Any], signature: inspect.Signature) -> F:
    """`call` under `method`'s name and docstring, with `signature`: what `help()`,
    `inspect` and IDEs show for `Client`'s method is `AsyncClient`'s, blocking."""
    functools.update_wrapper(call, method)
    call.__qualname__ = f"Client.{method.__name__}"
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = {
        **{
            name: parameter.annotation
            for name, parameter in signature.parameters.items()
            if parameter.annotation is not inspect.Parameter.empty
        },
        "return": signature.return_annotation,
    }
    return call


class Client:
    """The SDK, blocking: `with Client(server, token) as client: client.submit(manifest)`.

    Every method is `AsyncClient`'s, run on the client's own event loop (in a thread of its
    own); `logs`, `events` and the other streams are plain iterators. Close it (or use `with`)
    when done."""

    def __init__(self, server: str, token: str) -> None:
        """`server` is the control plane's URL (`http://host:8080`), `token` a tenant's token."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="trainyard-client", daemon=True
        )
        self._thread.start()
        self._client = AsyncClient(server, token)
        self._run(self._client.__aenter__())

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP session and stop the client's thread; closing twice is harmless."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.__aexit__(None, None, None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    @property
    def server(self) -> str:
        return self._client.server

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted (Ctrl-C) while waiting: the call must not go on in the background.
            future.cancel()
            raise

    def _iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._run(_next(items))
                except StopAsyncIteration:
                    return
        finally:
            self._run(_close(items))

    # AsyncClient's public methods, in its order; tests/trainyard/test_sdk.py checks that none
    # is missing and that each has its signature.
    submit = _blocking(AsyncClient.submit)
    jobs = _blocking(AsyncClient.jobs)
    job = _blocking(AsyncClient.job)
    history = _blocking(AsyncClient.history)
    pending = _blocking(AsyncClient.pending)
    cancel = _blocking(AsyncClient.cancel)
    checkpoint = _blocking(AsyncClient.checkpoint)
    nodes = _blocking(AsyncClient.nodes)
    drain_node = _blocking(AsyncClient.drain_node)
    undrain_node = _blocking(AsyncClient.undrain_node)
    scheduling_policy = _blocking(AsyncClient.scheduling_policy)
    set_scheduling_policy = _blocking(AsyncClient.set_scheduling_policy)
    events = _iterating(AsyncClient.events)
    wait = _blocking(AsyncClient.wait)
    logs = _iterating(AsyncClient.logs)
    grep = _iterating(AsyncClient.grep)
    models = _blocking(AsyncClient.models)
    model = _blocking(AsyncClient.model)
    model_version = _blocking(AsyncClient.model_version)
    publish_model = _blocking(AsyncClient.publish_model)
    publish_model_from_job = _blocking(AsyncClient.publish_model_from_job)
    update_model = _blocking(AsyncClient.update_model)
    set_model_alias = _blocking(AsyncClient.set_model_alias)
    remove_model_alias = _blocking(AsyncClient.remove_model_alias)
    set_model_webhook = _blocking(AsyncClient.set_model_webhook)
    remove_model_webhook = _blocking(AsyncClient.remove_model_webhook)
    deprecate_model = _blocking(AsyncClient.deprecate_model)
    download_model = _blocking(AsyncClient.download_model)
    deploy = _blocking(AsyncClient.deploy)
    deployments = _blocking(AsyncClient.deployments)
    deployment = _blocking(AsyncClient.deployment)
    deployment_history = _blocking(AsyncClient.deployment_history)
    autoscale = _blocking(AsyncClient.autoscale)
    stop_autoscaling = _blocking(AsyncClient.stop_autoscaling)
    set_canary = _blocking(AsyncClient.set_canary)
    promote_canary = _blocking(AsyncClient.promote_canary)
    roll_back_canary = _blocking(AsyncClient.roll_back_canary)
    scale = _blocking(AsyncClient.scale)
    undeploy = _blocking(AsyncClient.undeploy)
    deployment_metrics = _blocking(AsyncClient.deployment_metrics)
    predict = _blocking(AsyncClient.predict)
    stream_predict = _iterating(AsyncClient.stream_predict)
    task = _blocking(AsyncClient.task)
    cancel_task = _blocking(AsyncClient.cancel_task)
    wait_task = _blocking(AsyncClient.wait_task)
    define_pipeline = _blocking(AsyncClient.define_pipeline)
    pipeline = _blocking(AsyncClient.pipeline)
    remove_pipeline = _blocking(AsyncClient.remove_pipeline)
    infer = _blocking(AsyncClient.infer)
    inference_stats = _blocking(AsyncClient.inference_stats)
    follow_inference_stats = _iterating(AsyncClient.follow_inference_stats)
    inference_queries = _blocking(AsyncClient.inference_queries)
    submit_search = _blocking(AsyncClient.submit_search)
    searches = _blocking(AsyncClient.searches)
    search = _blocking(AsyncClient.search)
    search_trials = _blocking(AsyncClient.search_trials)
    search_best = _blocking(AsyncClient.search_best)
    cancel_search = _blocking(AsyncClient.cancel_search)
    search_events = _iterating(AsyncClient.search_events)


async def _next(items: AsyncGenerator[T, None]) -> T:
    # A coroutine, as `run_coroutine_threadsafe` wants; `anext()` gives another awaitable.
    return await anext(items)


async def _close(items: AsyncGenerator[T, None]) -> None:
    await items.aclose()
