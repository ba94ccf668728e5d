"""Type stubs for aplc: APL agents on aplc's compiler and VM."""

import os
from typing import Any, Awaitable, Callable, Dict, List, Literal, Mapping, Optional, TypedDict, Union

__version__: str

Context = Dict[str, Any]
ProviderFn = Callable[[Context], Union[Dict[str, Any], Awaitable[Dict[str, Any]]]]

class Diagnostic(TypedDict):
    code: str
    severity: Literal["error", "warning"]
    message: str
    line: int
    column: int

class ToolConfig(TypedDict, total=False):
    fn: Callable[..., Any]
    with_context: bool
    descriptor: Dict[str, Any]

class Options(TypedDict, total=False):
    with_providers: Mapping[str, ProviderFn]
    # Python tools, or a tool manifest: its path, or the parsed object with `mcpServers`.
    with_tools: Union[Mapping[str, Any], str, "os.PathLike[str]"]
    with_context: Mapping[str, Any]
    timeout: int
    max_runs: Optional[int]
    max_steps: int
    relaxed: bool
    debug: bool
    base_url: str
    api_key: str
    providers: Union[Mapping[str, Any], str]
    on_event: Callable[[Dict[str, Any]], None]
    # Answers a request for a person (spec/human.md): True/False or {"approve", "reason"}
    # for an approval, the value for the others, or LATER; sync or async.
    on_input: Callable[[Dict[str, Any]], Any]
    dialect: Literal["spec", "defuss-1.1"]
    # A durable run (spec/human.md §4.3): "sqlite:PATH" or "postgres://…", and its id.
    store: str
    run_id: str
    # Agents a run may call by a name its bundle does not link (spec/agents.md).
    agents: Mapping[str, "Program"]
    max_agent_depth: int

class ValidationError(ValueError):
    diagnostics: List[Diagnostic]

class RunError(RuntimeError):
    context: Context
    kind: str
    step: Optional[str]

class RunWaiting(Exception):
    run_id: str
    pending: List[Dict[str, Any]]
    store: str

class _Later: ...

LATER: _Later

class SchemaValidationError(ValueError): ...

Dialect = Literal["spec", "defuss-1.1"]

def check(source: str, relaxed: bool = ..., dialect: Dialect = ...) -> Literal[True]: ...
def compile(source: str, relaxed: bool = ..., dialect: Dialect = ...) -> bytes: ...
async def start(agent: Union[str, bytes], options: Optional[Options] = ...) -> Context: ...
def start_sync(agent: Union[str, bytes], options: Optional[Options] = ...) -> Context: ...
async def resume(store: str, run_id: str, options: Optional[Options] = ...) -> Context: ...
def resume_sync(store: str, run_id: str, options: Optional[Options] = ...) -> Context: ...
def answer(store: str, run_id: str, request_id: str, answer: Any, by: str = ...) -> List[str]: ...

class Program:
    @classmethod
    def load(cls, bundle: Union[bytes, bytearray, memoryview], dialect: Dialect = ...) -> Program: ...
    @classmethod
    def from_source(
        cls, source: str, relaxed: bool = ..., inputs: tuple[str, ...] = ..., dialect: Dialect = ...
    ) -> Program: ...
    async def start(self, options: Optional[Options] = ...) -> Context: ...
    def start_sync(self, options: Optional[Options] = ...) -> Context: ...

def infer_descriptor(fn: Callable[..., Any], name: Optional[str] = ...) -> Dict[str, Any]: ...
def describe_tools(context: Context) -> List[Dict[str, Any]]: ...
async def call_tool(tool_call: Dict[str, Any], context: Context) -> Dict[str, Any]: ...
async def call_tools(pending_tool_calls: List[Dict[str, Any]], context: Context) -> List[Dict[str, Any]]: ...
def validate_schema(result_json: Any, context: Context) -> bool: ...
