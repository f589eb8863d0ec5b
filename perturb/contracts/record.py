"""The record of one perturbed sample: everything needed to replay it bit for bit."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from perturb._version import __version__
from perturb.errors import InputError


@dataclass(frozen=True)
class Record:
    """What was applied to one sample: enough to replay it exactly."""

    op: str
    op_version: int
    severity: int
    variant: int
    seed: int
    sample_key: str
    key: str
    params: dict[str, Any]
    protect_border: bool
    backend: str
    device: str
    perturb_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise InputError(f"record has unknown fields {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> Record:
        return cls.from_dict(json.loads(text))
