"""The enums that cross the wire, and the one conversion between them and their proto values.

The gateway service (server), its client and the scheduler's weight publisher all convert here, so a
new enum value is added in one place and an unknown wire value is refused the same way everywhere.
`PAUSE_MODE_UNSPECIFIED` means "the receiver's default": KEEP on the gateway (the proto says so),
the run's `rollout.weight_update_mode` on the scheduler's PublishWeights.
"""

from __future__ import annotations

from enum import StrEnum

from asyncdapo.contracts.config import PauseMode
from asyncdapo.contracts.v1 import common_pb2


class Finish(StrEnum):
    """Why a generation ended."""

    STOP = "stop"  # EOS or a stop token
    LENGTH = "length"  # max_tokens (or the model's context) reached
    ABORT = "abort"  # Abort RPC, Pause(abort), drain deadline


_FINISH_TO_PB: dict[Finish, common_pb2.FinishReason] = {
    Finish.STOP: common_pb2.FINISH_REASON_STOP,
    Finish.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    Finish.ABORT: common_pb2.FINISH_REASON_ABORT,
}
_FINISH_FROM_PB: dict[int, Finish] = {v: k for k, v in _FINISH_TO_PB.items()}
_PAUSE_TO_PB: dict[PauseMode, common_pb2.PauseMode] = {
    PauseMode.KEEP: common_pb2.PAUSE_MODE_KEEP,
    PauseMode.ABORT: common_pb2.PAUSE_MODE_ABORT,
    PauseMode.WAIT: common_pb2.PAUSE_MODE_WAIT,
}
_PAUSE_FROM_PB: dict[int, PauseMode] = {v: k for k, v in _PAUSE_TO_PB.items()}


class UnknownEnumValue(ValueError):
    """A wire value this build does not know (a newer peer, or a corrupt message)."""


def finish_to_pb(finish: Finish) -> common_pb2.FinishReason:
    return _FINISH_TO_PB[finish]


def finish_from_pb(value: int) -> Finish:
    try:
        return _FINISH_FROM_PB[value]
    except KeyError:
        raise UnknownEnumValue(f"finish_reason {value} is not a FinishReason this build knows") from None


def pause_mode_to_pb(mode: PauseMode) -> common_pb2.PauseMode:
    return _PAUSE_TO_PB[mode]


def pause_mode_from_pb(value: int) -> PauseMode | None:
    """The mode a PauseMode wire value names; None for UNSPECIFIED (the receiver's default)."""
    if value == common_pb2.PAUSE_MODE_UNSPECIFIED:
        return None
    try:
        return _PAUSE_FROM_PB[value]
    except KeyError:
        raise UnknownEnumValue(f"mode {value} is not a PauseMode this build knows") from None
