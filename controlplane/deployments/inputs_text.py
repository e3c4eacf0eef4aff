"""A prediction's inputs as the JSON text its request carried, handed on by the direct path
instead of encoded again: encoding a 5 KiB item of floats costs about 0.3 ms (each float's
repr), as much as the rest of the control plane's part of a request.

`sent_inputs` finds that text in a body that is an object of the inputs alone (as the SDK and
most clients send a synchronous prediction); `InputsTexts` turns it into what the direct path
sends and counts: the text itself (the memo off), or the inputs' canonical JSON (the memo's
key), made once per tenant and text and kept for the next request of the same text, as a memo
hit is.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

from controlplane.deployments.tasks import canonical_json

_ONLY_INPUTS = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"inputs"[ \t\n\r]*:(.*)\}[ \t\n\r]*', re.DOTALL)
_MAY_OVERFLOW = re.compile(r"[eE][+-]?[0-9]{3}|[0-9]{309}")
"""A number whose float may be an infinity ("1e400", or 309 digits before its point): such a
text is encoded again, so that an infinity is refused as before (json.dumps's allow_nan)."""
CANONICAL_ENTRIES = 1024
"""The most (tenant, text) pairs whose canonical JSON a control plane keeps."""
CANONICAL_MAX_CHARS = 64 * 1024
"""Longer texts are not kept: a few large inputs' memory is not worth 0.3 ms each."""


def sent_inputs(body: str, document: Any) -> str | None:
    """The text of the inputs in `body` (parsed: `document`), where it is an object of them
    alone, their key written once and plainly; None else (the inputs are encoded again)."""
    if not (isinstance(document, dict) and document.keys() == {"inputs"}):
        return None
    # Once: a key written twice (the last one's value is the document's) is not matched.
    if body.count('"inputs"') != 1:
        return None
    matched = _ONLY_INPUTS.fullmatch(body)
    return None if matched is None else matched.group(1)


class InputsTexts:
    """What the direct path sends and counts of a request's inputs, from their text."""

    def __init__(self) -> None:
        self._canonical: OrderedDict[tuple[str, str], str] = OrderedDict()

    def text(self, tenant: str, inputs: list[Any], sent: str | None, *, canonical: bool) -> str:
        """The inputs' JSON text: `sent` (the request's own) as it is, or their canonical JSON
        when `canonical`; encoded again when there is no `sent` or it may hold an infinity.
        ValueError for NaN and the infinities."""
        if sent is None or _MAY_OVERFLOW.search(sent):
            return canonical_json(inputs) if canonical else json.dumps(inputs, allow_nan=False)
        if not canonical:
            return sent
        # By tenant: how long a request takes must not tell one tenant what another sent.
        key = (tenant, sent)
        found = self._canonical.get(key)
        if found is not None:
            self._canonical.move_to_end(key)
            return found
        made = canonical_json(inputs)
        if len(sent) <= CANONICAL_MAX_CHARS:
            self._canonical[key] = made
            if len(self._canonical) > CANONICAL_ENTRIES:
                self._canonical.popitem(last=False)
        return made
