"""What a framework adapter hands the model for a reply."""

from __future__ import annotations

import json
from typing import Any

from ._toolledger import Reply


def model_text(reply: Reply) -> str:
    """The tool's output as JSON when the effect is done; else the BLOCK package (its
    code first, then what to do), so the model reads why and never guesses."""
    view: Any = reply.output if reply.done else reply.package
    return json.dumps(view, ensure_ascii=False, sort_keys=True)
