"""The runtime API (spec §6): ``check``, ``compile``, ``start``, ``start_sync`` and
``Program``, over the native module; durable runs (``store``), ``resume`` and ``answer``
(spec/human.md §4.3)."""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import _aplc
from ._tools import ToolEntry, ToolTable, split_manifest, tool_entries

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
        "on_input",
        "dialect",
        "store",
        "run_id",
        "agents",
        "max_agent_depth",
    }
)

#: The options a durable run keeps from its start: a resume takes none of them.
RUN_OWN = frozenset(
    {
        "with_context",
        "timeout",
        "max_runs",
        "max_steps",
        "relaxed",
        "dialect",
        "store",
        "run_id",
        "agents",
        "max_agent_depth",
    }
)

DEFAULT_TIMEOUT_MS = _aplc.DEFAULT_TIMEOUT_MS
DEFAULT_MAX_STEPS = _aplc.DEFAULT_MAX_STEPS
DEFAULT_MAX_AGENT_DEPTH = _aplc.DEFAULT_MAX_AGENT_DEPTH
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


class RunWaiting(Exception):
    """A durable run waits for a person (spec/human.md): its requests are committed to
    its store. Answer them with :func:`answer`, then go on with :func:`resume`.
    ``run_id`` is the run's id, ``pending`` the requests still unanswered (dicts, as
    spec/human.md §2 shows them), ``store`` the store's URL as given."""

    def __init__(self, run_id: str, pending: List[Dict[str, Any]], store: str) -> None:
        asked = ", ".join(_printable(f"{r['id']} ({r['kind']}: {r['prompt']})") for r in pending)
        super().__init__(f"run {run_id!r} waits for input: {asked}")
        self.run_id = run_id
        self.pending = pending
        self.store = store


def _printable(text: str) -> str:
    """``text`` with its control characters escaped: a prompt may hold what a model wrote."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class _Later:
    """The type of :data:`LATER`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "aplc.LATER"


#: What ``on_input`` returns to leave a request unanswered: a durable run waits for it
#: in its store (:class:`RunWaiting`); an in-memory run, which cannot wait, fails.
LATER = _Later()


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
    :class:`ValidationError` on invalid source. The bundle records ``dialect`` and
    runs in it."""
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
        ``ValueError`` for bytes that are not a valid bundle. A bundle runs in the dialect
        it records; ``dialect`` is for bundles that record the spec's (those built before
        bundles recorded it)."""
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
    :class:`RunError` when the run fails. With ``store``, the run is durable and raises
    :class:`RunWaiting` when it waits for a person."""
    parsed = _Options(options)
    return await _Run(parsed).run(_program(agent, parsed)._native)


def start_sync(agent: Union[str, bytes], options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """:func:`start` for code that is not async: runs it on a new event loop."""
    return asyncio.run(start(agent, options))


async def resume(store: str, run_id: str, options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Goes on with the durable run ``run_id`` of ``store`` (one that waits, or one whose
    process died) with ``options``' providers, tools (the ones it started with),
    ``on_input`` and ``on_event``; the run keeps its own context, limits and timeout.
    Returns the final context, or raises :class:`RunWaiting` (requests still
    unanswered) or :class:`RunError`."""
    if not isinstance(store, str):
        raise TypeError(f"resume takes the store's URL as str, found {type(store).__name__}")
    if not isinstance(run_id, str):
        raise TypeError(f"resume takes the run id as str, found {type(run_id).__name__}")
    own = sorted(str(k) for k in (options or {}) if k in RUN_OWN)
    if own:
        raise ValueError(
            f"option(s) {', '.join(map(repr, own))} belong to the run: it resumes with the ones it started with"
        )
    parsed = _Options(options)
    return await _Run(parsed).resume(store, run_id)


def resume_sync(store: str, run_id: str, options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """:func:`resume` for code that is not async: runs it on a new event loop."""
    return asyncio.run(resume(store, run_id, options))


def answer(store: str, run_id: str, request_id: str, answer: Any, by: str = "python") -> List[str]:
    """Stores ``answer`` to request ``request_id`` of the durable run ``run_id`` waiting
    in ``store``: ``True``/``False`` or ``{"approve", "reason"}`` for an approval, the
    value for the others. It is checked against the request first (its kind, its
    schema); anything wrong (an unknown run or request, one answered already, a finished
    run) is a ``ValueError``, and nothing is stored. ``by`` is who answered, as the
    journal records it. Returns the ids of the run's requests still unanswered: when
    none are left, :func:`resume` goes on."""
    for name, value in (("store", store), ("run_id", run_id), ("request_id", request_id), ("by", by)):
        if not isinstance(value, str):
            raise TypeError(f"answer takes {name} as str, found {type(value).__name__}")
    return _aplc.answer_request(
        store, run_id, request_id, answer, by, lambda request, given: _reply(request, given, "answer")
    )


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
        # defuss-apl puts every option into the context (§6.1); its dialect takes the
        # options aplc does not know as context variables, like `with_context`'s.
        extra = {k: options[k] for k in unknown} if options.get("dialect") == "defuss-1.1" else {}
        if unknown and not extra:
            raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(OPTIONS))}")
        providers = options.get("with_providers") or {}
        if not isinstance(providers, Mapping) or not all(callable(p) for p in providers.values()):
            raise TypeError("with_providers must be a dict of model name to callable")
        self.providers: Dict[str, Callable[..., Any]] = {str(k): v for k, v in providers.items()}
        #: The providers awaited on the loop; the others run in a thread.
        self.async_providers = frozenset(k for k, v in self.providers.items() if inspect.iscoroutinefunction(v))
        #: The Python tools, and the tool manifest Rust runs (its MCP servers too).
        self.raw_tools, self.manifest = split_manifest(options.get("with_tools") or {})
        self.tools: Dict[str, ToolEntry] = tool_entries(self.raw_tools)
        context = options.get("with_context") or {}
        if not isinstance(context, Mapping):
            raise TypeError("with_context must be a dict")
        self.context: Dict[str, Any] = {**extra, **context}
        self.timeout = _int_option(options, "timeout", DEFAULT_TIMEOUT_MS, 0)
        self.max_runs = _int_option(options, "max_runs", None, 0)
        self.max_steps = _int_option(options, "max_steps", DEFAULT_MAX_STEPS, 1)
        self.max_agent_depth = _int_option(options, "max_agent_depth", DEFAULT_MAX_AGENT_DEPTH, 0)
        agents = options.get("agents") or {}
        if not isinstance(agents, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Program) for k, v in agents.items()
        ):
            raise TypeError("option 'agents' must be a dict of agent name to aplc.Program")
        #: The agents a run may call by a name its bundle does not link (spec/agents.md).
        self.agents: Dict[str, "Program"] = dict(agents)
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
        on_input = options.get("on_input")
        if on_input is not None and not callable(on_input):
            raise TypeError("option 'on_input' must be callable")
        #: Answers a run's requests for a person (spec/human.md §4.3).
        self.on_input: Optional[Callable[[Dict[str, Any]], Any]] = on_input
        #: A durable run's store (spec/durability.md) and run id.
        self.store = _str_option(options, "store")
        self.run_id = _str_option(options, "run_id")
        if self.run_id is not None and self.store is None:
            raise ValueError("option 'run_id' names a durable run: it needs option 'store'")
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
    """One run, driven on the caller's event loop: the native run polls the machine (in
    Rust, GIL released) to its next action; this coroutine performs it (awaits a Python
    provider or tool, or a Rust provider's awaitable) and hands the answer back. No
    thread hop and no JSON text per step: contexts and answers cross as Python objects.
    Sync providers and tools run in a thread (``asyncio.to_thread``), as the issue asks:
    one that blocks must not block the loop."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.tool_table = ToolTable(options.raw_tools, options.tools)

    def _config(self) -> Dict[str, Any]:
        o = self.options
        listening = o.on_event is not None or o.debug
        return {
            "context": o.context,
            "timeout_ms": o.timeout,
            "max_runs": o.max_runs,
            "max_steps": o.max_steps,
            "models": list(o.providers),
            "tools": [(t.descriptor, t.with_context) for t in o.tools.values()],
            "events": listening,
            "on_delta": self.on_event if listening else None,
            "base_url": o.base_url,
            "api_key": o.api_key,
            "providers_json": o.providers_json,
            "manifest": o.manifest,
            "on_input": o.on_input is not None,
            "agents": [(name, program._native) for name, program in o.agents.items()],
            "max_agent_depth": o.max_agent_depth,
        }

    async def run(self, native: Any) -> Dict[str, Any]:
        store = self.options.store
        if store is not None:
            ended = await _aplc.start_durable(native, self._config(), store, self.options.run_id, self)
            return self._ended(ended, store)
        run = native.begin(self._config())
        if inspect.isawaitable(run):  # the manifest's MCP servers start first
            run = await run
        try:
            action = await self._drive(run)
        finally:
            # A no-op for a finished run; for a cancelled one, stops the machine and a
            # Rust provider call in flight.
            run.cancel()
        _, events, context, error = action
        if events:
            self._deliver(events)
        return _finished(context, error, native.dialect)

    async def resume(self, store: str, run_id: str) -> Dict[str, Any]:
        return self._ended(await _aplc.resume_durable(self._config(), store, run_id, self), store)

    @staticmethod
    def _ended(ended: Tuple[Any, ...], store: str) -> Dict[str, Any]:
        """A durable run's end: ``("done", context, error, dialect)`` or ``("waiting",
        run_id, pending, error)``, ``error`` what ``on_input`` raised (the run waits in
        its store all the same)."""
        if ended[0] == "done":
            _, context, error, dialect = ended
            return _finished(context, error, dialect)
        _, run_id, pending, error = ended
        if error is not None:
            raise error
        raise RunWaiting(run_id, pending, store)

    async def _drive(self, run: Any) -> Tuple[Any, ...]:
        """Performs the run's actions until it is done; returns the ``done`` action.
        A person's answers (``on_input``) are awaited outside the run's timer: the run's
        timeout counts active time only, and its clock stands still while it waits."""
        action = run.advance()
        while True:
            action = await self._drive_timed(run, action)
            if action[0] == "done":
                return action
            action = await self._ask(run, action)

    async def _ask(self, run: Any, action: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """Asks ``on_input`` for every request of an ``input`` action and hands the
        answers to the run."""
        if action[1]:
            self._deliver(action[1])
        answers = await self._answers(action[2])
        if any(reply is None for _, reply in answers):
            answers = []  # a request left for later: an in-memory run has nowhere to wait
        return run.answer_input(answers)

    async def _answers(self, requests: List[Dict[str, Any]]) -> List[Tuple[str, Optional[Dict[str, Any]]]]:
        """``on_input``'s answers to ``requests``, as ``(id, reply)``; the reply is
        ``None`` for a request it left for later (:data:`LATER`)."""
        on_input = self.options.on_input
        assert on_input is not None  # the native run asks only when it is given
        answers: List[Tuple[str, Optional[Dict[str, Any]]]] = []
        for request in requests:
            if inspect.iscoroutinefunction(on_input):
                result = await on_input(request)
            else:
                result = await asyncio.to_thread(on_input, request)
                if inspect.isawaitable(result):
                    result = await result
            answers.append((request["id"], None if result is LATER else _reply(request, result)))
        return answers

    async def _drive_timed(self, run: Any, action: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """Performs the run's actions under its timer until it is done or asks a
        person; returns that action."""
        if _timeout_at is None:  # Python < 3.11: a timer per call
            while action[0] not in ("done", "input"):
                if action[1]:
                    self._deliver(action[1])
                try:
                    kind, payload = await asyncio.wait_for(self._perform(action), run.remaining())
                except asyncio.TimeoutError:
                    action = run.timed_out()
                    continue
                action = run.answer(kind, payload)
            return action
        # One timer for the whole run. Only the timer's own expiry ends the block with
        # TimeoutError: the wrappers catch whatever a provider or tool raises.
        loop = asyncio.get_running_loop()
        try:
            async with _timeout_at(loop.time() + run.remaining()):
                while action[0] not in ("done", "input"):
                    if action[1]:
                        self._deliver(action[1])
                    kind, payload = await self._perform(action)
                    action = run.answer(kind, payload)
                return action
        except TimeoutError:
            action = run.timed_out()
            while action[0] != "done":  # the machine ends a timed-out run at once
                if action[1]:
                    self._deliver(action[1])
                action = run.timed_out()
            return action

    async def _perform(self, action: Tuple[Any, ...]) -> Tuple[str, Any]:
        what = action[0]
        if what == "provider":
            return await self.call_provider(action[2], action[3])
        if what == "tool":
            return await self.call_tool(action[2], action[3], action[4])
        return ("rust", await action[2])

    async def call_provider(self, model: str, context: Dict[str, Any]) -> Tuple[str, Any]:
        if model not in self.options.providers:
            model = "*"  # the native run asks only for models with a provider, or any with "*"
        fn = self.options.providers[model]
        context["with_tools"] = self.tool_table
        try:
            if model in self.options.async_providers:
                result = await fn(context)
            else:
                result = await asyncio.to_thread(fn, context)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as e:  # §2.2.1: the executor catches it and the run goes on
            return ("raised", _exception_text(e))
        if type(result) is dict:
            return ("ok", result)
        if not isinstance(result, Mapping):
            return (
                "invalid",
                f"invalid provider response: the provider for {model!r} returned "
                f"{type(result).__name__}, expected a dict (an OpenAI-style response)",
            )
        return ("ok", dict(result))

    async def call_tool(self, name: str, arguments: Dict[str, Any], context: Optional[Dict[str, Any]]) -> Tuple[str, Any]:
        entry = self.options.tools[name]
        try:
            result = await entry.invoke(arguments, context)
        except Exception as e:  # §2.2.2: a failed tool call is a result with_error
            return ("raised", _exception_text(e))
        return ("ok", result)

    def _deliver(self, events: List[Dict[str, Any]]) -> None:
        for event in events:
            self.on_event(event)

    def on_event(self, event: Dict[str, Any]) -> None:
        if self.options.debug:
            print(f"aplc: {json.dumps(event)}", file=sys.stderr)
        if self.options.on_event is not None:
            try:
                self.options.on_event(event)
            except Exception as e:  # a listener's bug must not stop the run or the loop
                print(f"aplc: on_event raised {_exception_text(e)}", file=sys.stderr)


def _finished(context: Dict[str, Any], error: Optional[Tuple[str, str, Optional[str]]], dialect: str) -> Dict[str, Any]:
    """A finished run's context, or its :class:`RunError`."""
    if dialect == "defuss-1.1":
        _add_context_view(context)
    if error is not None:
        kind, message, step = error
        raise RunError(message, context, kind, step)
    return context


def _reply(request: Dict[str, Any], result: Any, who: str = "on_input") -> Dict[str, Any]:
    """``on_input``'s return value (or :func:`answer`'s ``answer``) as a reply:
    ``True``/``False`` or ``{"approve", "reason"}`` for an approval, the value for the
    others."""
    if request.get("kind") != "approval":
        return {"value": result}
    if isinstance(result, bool):
        return {"approve": result}
    if isinstance(result, Mapping) and isinstance(result.get("approve"), bool):
        reason = result.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ValueError(f"{who}: the reason for request {request['id']!r} must be a str")
        return {"approve": result["approve"], "reason": reason}
    raise ValueError(
        f"{who}: the answer to approval request {request['id']!r} must be True, False "
        f"or {{'approve': bool, 'reason': str}}, found {type(result).__name__}"
    )


def _add_context_view(context: Dict[str, Any]) -> None:
    """defuss-apl's final context also holds ``context``: every variable (§2.4's
    "union of executor-maintained and user-settable variables"), without the history.
    A new dict sharing the values, so it is no cycle (``json.dumps`` takes it)."""
    context["context"] = {k: v for k, v in context.items() if k != "context_history"}


#: ``asyncio.timeout_at`` (Python 3.11 on); older versions time each call instead.
_timeout_at = getattr(asyncio, "timeout_at", None)


def _exception_text(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
