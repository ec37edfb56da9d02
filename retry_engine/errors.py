"""The package's error hierarchy.

Every error is both a :class:`RetryEngineError` and the matching builtin, and its
message starts with a stable condition code in brackets, so callers can catch
either and logs can be grepped by code.
"""

from __future__ import annotations


class RetryEngineError(Exception):
    """Raised for every error the retry engine reports on purpose."""

    code: str = "RETRY_ENGINE_ERROR"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        super().__init__(f"[{self.code}] {message}")


class ConfigError(RetryEngineError, ValueError):
    """Raised when a configuration file or value is invalid."""

    code = "INVALID_CONFIG"


class DurationError(ConfigError):
    """Raised when a duration (a setting's, a command's ``--retention``) is not ``<positive int><unit>``."""

    code = "INVALID_DURATION"


class DelayLevelError(DurationError):
    """Raised when a delay-level string has a token that is not ``<positive int><unit>``."""

    code = "INVALID_DELAY_LEVEL"


class InvalidNameError(RetryEngineError, ValueError):
    """Raised when a group or topic name breaks RocketMQ's naming rules."""

    code = "INVALID_NAME"


class SchemaMismatchError(RetryEngineError, ValueError):
    """Raised when a DataFrame or table does not have the columns a table needs."""

    code = "SCHEMA_MISMATCH"


class DeltaSourceError(RetryEngineError, RuntimeError):
    """Raised when a Delta table cannot be streamed as asked (e.g. a commit removes data)."""

    code = "DELTA_SOURCE_ERROR"


class DeltaSinkError(RetryEngineError, RuntimeError):
    """Raised when a micro-batch cannot be committed to a Delta table."""

    code = "DELTA_SINK_ERROR"


class EnvironmentProblem(RetryEngineError, RuntimeError):
    """Raised when the machine lacks something the engine needs (e.g. Java 17)."""

    code = "ENVIRONMENT"


class SelectionError(RetryEngineError, ValueError):
    """Raised when a DLQ filter is invalid (bad name, regex, time range or id list)."""

    code = "INVALID_SELECTION"


class RedriveError(RetryEngineError, RuntimeError):
    """Raised when a re-drive cannot go ahead as asked (e.g. it conflicts with an unfinished one)."""

    code = "REDRIVE_ERROR"


class TablesUnavailableError(RetryEngineError, RuntimeError):
    """Raised when ``status`` or ``plots`` cannot read the engine's tables (e.g. a wrong lake path)."""

    code = "TABLES_UNAVAILABLE"


class InvalidMessageError(RetryEngineError, ValueError):
    """Raised when a message to send is malformed (empty or oversized body, bad properties)."""

    code = "INVALID_MESSAGE"


class MessageTypeError(InvalidMessageError, TypeError):
    """Raised when a message field has the wrong Python type."""

    code = "WRONG_TYPE"


class SendFailedError(RetryEngineError, RuntimeError):
    """Raised when a send still fails after ``retry_times_when_send_failed`` retries or its timeout."""

    code = "SEND_FAILED"


class SubscriptionError(RetryEngineError, ValueError):
    """Raised when a consumer subscribes to what it may not read (a DLQ, R9) or is set up wrongly."""

    code = "INVALID_SUBSCRIPTION"


class ConsumeResultWriteError(RetryEngineError, RuntimeError):
    """Raised when a consumer cannot write its consume results after every retry (R12); the batch replays."""

    code = "CONSUME_RESULT_WRITE_FAILED"


class ConcurrentWriteError(RetryEngineError, RuntimeError):
    """Raised when a commit that must build on a checked table version finds that another writer committed first."""

    code = "TABLE_MOVED"


class LakeOwnedError(RetryEngineError, RuntimeError):
    """Raised when an engine starts on a lake whose lease another live engine holds (B8)."""

    code = "LAKE_OWNED"


class LeaseLostError(RetryEngineError, RuntimeError):
    """Raised when an engine that was taken over tries to commit: it is fenced and stops (B8)."""

    code = "LEASE_LOST"


class LakeResumeError(RetryEngineError, RuntimeError):
    """Raised when an engine cannot resume the lake's progress from its checkpoint without loss or duplicates (B8)."""

    code = "LAKE_RESUME"


class EngineStoppedError(RetryEngineError, RuntimeError):
    """Raised when the engine query stops before a wait on it is over (e.g. it lost the lake lease)."""

    code = "ENGINE_STOPPED"


class StateUnreadableError(RetryEngineError, ValueError):
    """Raised when a schedule-stage state value cannot be read (corrupt, truncated, wrong schema)."""

    code = "STATE_UNREADABLE"


class StateVersionError(StateUnreadableError):
    """Raised when a schedule-stage state value has a layout version this release does not read."""

    code = "STATE_VERSION_UNKNOWN"


class LakeNotFoundError(TablesUnavailableError):
    """Raised when a command that reads a lake finds none where it looked (a missing folder, a file, no engine table)."""

    code = "LAKE_NOT_FOUND"


class InvalidConsumeResultError(RetryEngineError, ValueError):
    """Raised when consume results to append break the engine's input contract (the code names which rule)."""

    code = "INVALID_CONSUME_RESULT"


class ConsumeResultTypeError(InvalidConsumeResultError, TypeError):
    """Raised when consume results to append are not rows, or a column's values do not fit its type."""

    code = "COLUMN_TYPE_MISMATCH"


class StateSplitError(RetryEngineError, RuntimeError):
    """Raised when a sealed state key's published msg ids are missing or damaged, or a seal cannot be placed."""

    code = "STATE_SPLIT_ERROR"


class StorageError(RetryEngineError, OSError):
    """Raised when the storage holding a table cannot be reached or refuses the request (the code says which)."""

    code = "STORAGE_UNAVAILABLE"


class EngineStateError(RetryEngineError, ValueError):
    """Raised when the lake's engine-state row holds something the engine never writes (another writer, a damaged file)."""

    code = "ENGINE_STATE_DAMAGED"
