"""The runtime API (spec §6): ``check``, ``compile``, ``start``, ``start_sync`` and
``Program``, over the native module."""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import _aplc
from ._tools import ToolEntry, ToolTable, tool_entries

#: The options ``start`` accepts (§6.1, plus aplc's own).
OPTIONS = frozenset(
    {
        "with_providers",
        "with_tools",
        "with_context",
        "timeout",
        "max_runs",
        "max_steps",
        "relaxed",
        "debug",
        "base_url",
        "api_key",
        "providers",
        "on_event",
        "dialect",
    }
)

DEFAULT_TIMEOUT_MS = _aplc.DEFAULT_TIMEOUT_MS
DEFAULT_MAX_STEPS = _aplc.DEFAULT_MAX_STEPS
DIALECTS = ("spec", "defuss-1.1")


class ValidationError(ValueError):
    """The agent's source has errors. ``diagnostics`` lists them (dicts with ``code``,
    ``severity``, ``message``, ``line`` and ``column``); ``str()`` is the rendered text."""

    def __init__(self, rendered: str, diagnostics: List[Dict[str, Any]]) -> None:
        super().__init__(rendered)
        self.diagnostics = diagnostics

    def __str__(self) -> str:
        return str(self.args[0])


class RunError(RuntimeError):
    """A run failed (timeout, budget, unknown step, ...). ``context`` is the context so
    far, ``kind`` the failure's stable name and ``step`` the step it failed in."""

    def __init__(self, message: str, context: Dict[str, Any], kind: str, step: Optional[str]) -> None:
        super().__init__(message)
        self.context = context
        self.kind = kind
        self.step = step


def _diagnostics(rows: List[Tuple[str, str, str, int, int]]) -> List[Dict[str, Any]]:
    return [
        {"code": code, "severity": severity, "message": message, "line": line, "column": column}
        for code, severity, message, line, column in rows
    ]


def _source_text(source: Any, what: str) -> str:
    if not isinstance(source, str):
        raise TypeError(f"{what} takes the agent's source as str, found {type(source).__name__}")
    return source


def check(source: str, relaxed: bool = False, dialect: str = "spec") -> bool:
    """``True`` if ``source`` is a valid agent; raises :class:`ValidationError` otherwise.
    ``dialect="defuss-1.1"`` allows defuss-apl 1.1.0's helpers (spec/dialects.md)."""
    has_errors, (rows, rendered) = _aplc.check_source(_source_text(source, "check"), bool(relaxed), [], dialect)
    if has_errors:
        raise ValidationError(rendered, _diagnostics(rows))
    return True


def compile(source: str, relaxed: bool = False, dialect: str = "spec") -> bytes:  # noqa: A001 (the API's name)
    """The bundle of ``source`` (what ``aplc build`` writes); raises
    :class:`ValidationError` on invalid source. A bundle does not record its dialect:
    load it with the same one."""
    bundle, (rows, rendered) = _aplc.build_bundle(_source_text(source, "compile"), bool(relaxed), dialect)
    if bundle is None:
        raise ValidationError(rendered, _diagnostics(rows))
    return bundle


class Program:
    """A compiled agent: compiled (or its bundle checked) once, started any number of
    times, from any number of tasks or threads."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @classmethod
    def load(cls, bundle: Union[bytes, bytearray, memoryview], dialect: str = "spec") -> "Program":
        """Loads bundle bytes (from :func:`compile` or ``aplc build``). Raises
        ``ValueError`` for bytes that are not a valid bundle."""
        if not isinstance(bundle, (bytes, bytearray, memoryview)):
            raise TypeError(f"Program.load takes bundle bytes, found {type(bundle).__name__}")
        return cls(_aplc.NativeProgram.load(bytes(bundle), dialect))

    @classmethod
    def from_source(
        cls, source: str, relaxed: bool = False, inputs: Tuple[str, ...] = (), dialect: str = "spec"
    ) -> "Program":
        """Compiles ``source`` for running; ``inputs`` are the ``with_context`` names the
        runs will pass. Raises :class:`ValidationError` on invalid source."""
        native, (rows, rendered) = _aplc.NativeProgram.compile(
            _source_text(source, "Program.from_source"), bool(relaxed), list(inputs), dialect
        )
        if native is None:
            raise ValidationError(rendered, _diagnostics(rows))
        return cls(native)

    async def start(self, options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Runs the program; see :func:`aplc.start`."""
        return await _Run(_Options(options)).run(self._native)

    def start_sync(self, options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """:meth:`start` for code that is not async (a new event loop for the run)."""
        return asyncio.run(self.start(options))


async def start(agent: Union[str, bytes], options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Validates and runs ``agent`` (``.apl`` source, or bundle bytes) and returns the
    final context. Raises :class:`ValidationError` on invalid source and
    :class:`RunError` when the run fails."""
    parsed = _Options(options)
    return await _Run(parsed).run(_program(agent, parsed)._native)


def start_sync(agent: Union[str, bytes], options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """:func:`start` for code that is not async: runs it on a new event loop."""
    return asyncio.run(start(agent, options))


def _program(agent: Any, options: "_Options") -> Program:
    if isinstance(agent, (bytes, bytearray, memoryview)):
        return Program.load(agent, options.dialect)
    if isinstance(agent, str):
        return Program.from_source(agent, options.relaxed, tuple(options.context), options.dialect)
    raise TypeError(f"start takes .apl source (str) or bundle bytes, found {type(agent).__name__}")


def _int_option(options: Mapping[str, Any], name: str, default: Optional[int], minimum: int) -> Optional[int]:
    value = options.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"option {name!r} must be an int, found {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"option {name!r} must be at least {minimum}, found {value}")
    return value


class _Options:
    """The options of one run, checked."""

    def __init__(self, options: Optional[Mapping[str, Any]]) -> None:
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise TypeError(f"options must be a dict, found {type(options).__name__}")
        if "jinja2_env" in options:
            raise ValueError("option 'jinja2_env' is not supported: aplc compiles templates with its own engine")
        unknown = sorted(str(k) for k in options if k not in OPTIONS)
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(OPTIONS))}")
        providers = options.get("with_providers") or {}
        if not isinstance(providers, Mapping) or not all(callable(p) for p in providers.values()):
            raise TypeError("with_providers must be a dict of model name to callable")
        self.providers: Dict[str, Callable[..., Any]] = {str(k): v for k, v in providers.items()}
        self.raw_tools = options.get("with_tools") or {}
        self.tools: Dict[str, ToolEntry] = tool_entries(self.raw_tools)
        context = options.get("with_context") or {}
        if not isinstance(context, Mapping):
            raise TypeError("with_context must be a dict")
        self.context: Dict[str, Any] = dict(context)
        try:
            self.context_json = json.dumps(self.context)
        except (TypeError, ValueError) as e:
            raise TypeError(f"with_context must hold JSON values only: {e}") from None
        self.timeout = _int_option(options, "timeout", DEFAULT_TIMEOUT_MS, 0)
        self.max_runs = _int_option(options, "max_runs", None, 0)
        self.max_steps = _int_option(options, "max_steps", DEFAULT_MAX_STEPS, 1)
        self.relaxed = bool(options.get("relaxed", False))
        self.debug = bool(options.get("debug", False))
        self.base_url = _str_option(options, "base_url")
        self.api_key = _str_option(options, "api_key")
        providers_config = options.get("providers")
        if providers_config is None or isinstance(providers_config, str):
            self.providers_json = providers_config
        elif isinstance(providers_config, Mapping):
            self.providers_json = json.dumps(providers_config)
        else:
            raise TypeError("option 'providers' must be a routing config dict or its JSON text")
        on_event = options.get("on_event")
        if on_event is not None and not callable(on_event):
            raise TypeError("option 'on_event' must be callable")
        self.on_event = on_event
        dialect = options.get("dialect", "spec")
        if dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}")
        self.dialect: str = dialect


def _str_option(options: Mapping[str, Any], name: str) -> Optional[str]:
    value = options.get(name)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"option {name!r} must be a str")
    return value


class _Run:
    """One run: the callbacks the native run calls on this event loop, and the tasks they
    started (cancelled when the run ends, so a cancelled run leaves nothing behind)."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.tasks: set = set()
        self.tool_table = ToolTable(options.raw_tools, options.tools)

    async def run(self, native: Any) -> Dict[str, Any]:
        o = self.options
        config = {
            "context_json": o.context_json,
            "timeout_ms": o.timeout,
            "max_runs": o.max_runs,
            "max_steps": o.max_steps,
            "models": list(o.providers),
            "call_provider": self.call_provider,
            "tools": [(json.dumps(t.descriptor), t.with_context) for t in o.tools.values()],
            "call_tool": self.call_tool,
            "on_event": self.on_event if (o.on_event is not None or o.debug) else None,
            "base_url": o.base_url,
            "api_key": o.api_key,
            "providers_json": o.providers_json,
        }
        try:
            context_json, error = await native.run(config)
        finally:
            for task in list(self.tasks):
                task.cancel()
        context = json.loads(context_json)
        if error is not None:
            kind, message, step = error
            raise RunError(message, context, kind, step)
        return context

    def _track(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def call_provider(self, model: str, context_json: str) -> Tuple[str, str]:
        self._track()
        fn = self.options.providers[model]
        context = json.loads(context_json)
        context["with_tools"] = self.tool_table
        try:
            if inspect.iscoroutinefunction(fn):
                result = await fn(context)
            else:
                result = await asyncio.to_thread(fn, context)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as e:  # §2.2.1: the executor catches it and the run goes on
            return ("raised", _exception_text(e))
        if not isinstance(result, Mapping):
            return (
                "invalid",
                f"invalid provider response: the provider for {model!r} returned "
                f"{type(result).__name__}, expected a dict (an OpenAI-style response)",
            )
        try:
            return ("ok", json.dumps(result))
        except (TypeError, ValueError) as e:
            return ("invalid", f"invalid provider response: not JSON-serialisable: {e}")

    async def call_tool(self, name: str, arguments_json: str, context_json: Optional[str]) -> Tuple[str, str]:
        self._track()
        entry = self.options.tools[name]
        context = json.loads(context_json) if context_json is not None else None
        try:
            result = await entry.invoke(json.loads(arguments_json), context)
        except Exception as e:  # §2.2.2: a failed tool call is a result with_error
            return ("raised", _exception_text(e))
        try:
            return ("ok", json.dumps(result))
        except (TypeError, ValueError) as e:
            return ("invalid", f"the tool's result is not JSON-serialisable: {e}")

    def on_event(self, event_json: str) -> None:
        event = json.loads(event_json)
        if self.options.debug:
            print(f"aplc: {event_json}", file=sys.stderr)
        if self.options.on_event is not None:
            try:
                self.options.on_event(event)
            except Exception as e:  # a listener's bug must not stop the run or the loop
                print(f"aplc: on_event raised {_exception_text(e)}", file=sys.stderr)


def _exception_text(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
