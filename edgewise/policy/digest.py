"""A policy's content digest: which version of a policy decided a frame.

``policy_digest`` hashes what a policy *does*: the validated value of every key
under ``spec`` (walked through the schema's field metadata, so comments, key order,
quoting and defaults written out or left implicit do not matter; ``metadata`` does
not count either) and, for a learned policy, the gain model's trees and quantiles. The edge daemon writes it into every frame
record (``policy_digest``, docs/records.md); the what-if replay
(:mod:`edgewise.policy.replay`) compares it with the digest of the policy it
replays to tell "these records were decided by this very policy" (the replay must
reproduce them exactly) from "by another version of it".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping

from edgewise.policy.fields import field_specs
from edgewise.policy.schema import Policy

#: Hex digits kept of the SHA-256 (48 bits: no collision between the versions of a site's policies).
DIGEST_CHARS = 12


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {key: _canonical(getattr(value, attr)) for key, (attr, _spec) in field_specs(type(value)).items()}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    return value


def learned_digest(policy: Policy) -> str:
    """The SHA-256 of the gain model's trees and quantiles ("" without one): which model a
    ``signals.learnedModel`` path held when the policy was loaded (the path alone does not say)."""
    if policy.learned is None:
        return ""
    model = dict(policy.learned.trees.to_dict(), quantiles=policy.learned.quantiles.tolist())
    return hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()


def policy_digest(policy: Policy) -> str:
    """The first :data:`DIGEST_CHARS` hex digits of the SHA-256 of the policy's content."""
    doc = _canonical(policy.spec)
    if policy.learned is not None:
        doc["learned"] = learned_digest(policy)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
