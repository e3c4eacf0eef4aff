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
from controlplane.jobs.manifest import check_storable

_ONLY_INPUTS = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"inputs"[ \t\n\r]*:(.*)\}[ \t\n\r]*', re.DOTALL)
_LARGE_EXPONENT = re.compile(r"[eE][+-]?[0-9]{3}")
_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9" * 10)
_LONG_DIGITS = b"9" * 309
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


def check_sent_storable(inputs: list[Any], sent: str | None) -> None:
    """`check_storable` of `inputs`, unless their text `sent` shows there is nothing to find:
    JSON writes a NUL or a lone surrogate only as a \\u escape (walking every item costs a
    tenth of a millisecond for 784 floats)."""
    if sent is None or "\\u" in sent:
        check_storable(inputs)


def _may_overflow(text: str) -> bool:
    """Whether a number in `text` may be an infinity as a float ("1e400", or 309 digits before
    its point): such a text is encoded again, so that an infinity is refused as before
    (json.dumps's allow_nan). Looked for with C-speed scans first: a regular expression over
    the whole text costs a third of what not encoding saves."""
    if ("e" in text or "E" in text) and _LARGE_EXPONENT.search(text):
        return True
    # Every digit made a 9, which no other character of UTF-8 is: a run of 309 is a number's.
    return _LONG_DIGITS in text.encode(errors="surrogatepass").translate(_DIGITS_AS_NINES)


class InputsTexts:
    """What the direct path sends and counts of a request's inputs, from their text."""

    def __init__(self) -> None:
        self._canonical: OrderedDict[tuple[str, str], str] = OrderedDict()

    def text(self, tenant: str, inputs: list[Any], sent: str | None, *, canonical: bool) -> str:
        """The inputs' JSON text: `sent` (the request's own) as it is, or their canonical JSON
        when `canonical`; encoded again when there is no `sent` or it may hold an infinity.
        ValueError for NaN and the infinities."""
        if sent is None:
            return canonical_json(inputs) if canonical else json.dumps(inputs, allow_nan=False)
        # By tenant: how long a request takes must not tell one tenant what another sent.
        key = (tenant, sent)
        if canonical:
            # Looked for first (a memo hit's path): only texts the scan for an infinity passed
            # are kept, so a text found was scanned already.
            found = self._canonical.get(key)
            if found is not None:
                self._canonical.move_to_end(key)
                return found
        if _may_overflow(sent):
            return canonical_json(inputs) if canonical else json.dumps(inputs, allow_nan=False)
        if not canonical:
            return sent
        made = canonical_json(inputs)
        if len(sent) <= CANONICAL_MAX_CHARS:
            self._canonical[key] = made
            if len(self._canonical) > CANONICAL_ENTRIES:
                self._canonical.popitem(last=False)
        return made
