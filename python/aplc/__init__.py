"""aplc for Python: APL agents checked by aplc's compiler and run on its VM, with
providers and tools written as Python functions (spec §4-§6)."""

from ._aplc import VERSION as __version__
from ._runtime import (
    LATER,
    Program,
    RunError,
    RunWaiting,
    ValidationError,
    answer,
    check,
    compile,
    resume,
    resume_sync,
    start,
    start_sync,
)
from ._tools import (
    SchemaValidationError,
    call_tool,
    call_tools,
    describe_tools,
    infer_descriptor,
    validate_schema,
)

__all__ = [
    "LATER",
    "Program",
    "RunError",
    "RunWaiting",
    "SchemaValidationError",
    "ValidationError",
    "answer",
    "call_tool",
    "call_tools",
    "check",
    "compile",
    "describe_tools",
    "infer_descriptor",
    "resume",
    "resume_sync",
    "start",
    "start_sync",
    "validate_schema",
]
