"""Contexts: each one is a Jupyter kernel with its own state, language and working directory.

We drive kernels with Debian's jupyter_client (the Jupyter messaging protocol over ZeroMQ): one
KernelManager (the process) and one BlockingKernelClient (the channels) per context. An
execution holds the context's lock for its whole run, so two requests for one context queue up
as they would in a notebook, while different contexts run in parallel.

Supervision: a kernel that dies while running code ends that execution with a clear error and is
restarted at once; one that dies while idle is restarted by `Registry.watch` (or at the start of
the next execution, whichever comes first). Either way the context keeps its id, language and
cwd, and the next execution works.

Sandbox-wide variables (the create's `envs`, the sandbox id) are read from the agent's
`GET /envs` (open to loopback) before every execution and applied to the kernel when they
changed: on the vm runtime this service starts in the template's snapshot, before any sandbox
exists, so the environment it and its first kernel inherited lacks them.
"""

import json
import os
import queue
import re
import threading
import time
import urllib.request
import uuid

from jupyter_client import KernelManager

from . import output

# Language -> kernel spec name (the specs are written into the image by the recipe).
KERNELS = {
    "python": "warren-python",
    "bash": "warren-bash",
    "javascript": "warren-javascript",
    "typescript": "warren-typescript",
    # Only in the code-interpreter-full template.
    "r": "warren-r",
    "java": "warren-java",
}
# Where the recipe writes the kernel specs: a language is available when its spec is there.
KERNEL_DIR = "/usr/local/share/jupyter/kernels"
# Languages whose cells run on Node.js (TypeScript is transpiled first).
NODE_LANGUAGES = ("javascript", "typescript")
# The SDKs' language aliases.
ALIASES = {"js": "javascript", "ts": "typescript"}
DEFAULT_CWD = "/home/user"
# How often a waiting execution sends a keepalive line (the SDKs ignore them; they keep idle
# proxies and load balancers from closing the stream).
KEEPALIVE_SECONDS = 5.0
# How long an interrupted execution may take to stop before the kernel is restarted instead.
INTERRUPT_GRACE_SECONDS = 5.0
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The sandbox agent's sandbox-wide variables (envd's port).
AGENT_ENVS_URL = os.environ.get("WARREN_AGENT_ENVS_URL", "http://127.0.0.1:49983/envs")


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def sandbox_env():
    """The sandbox-wide environment variables the agent holds ({} if it cannot be asked)."""
    try:
        # Straight to the agent: never through an HTTP proxy a user's variables name.
        with _DIRECT.open(AGENT_ENVS_URL, timeout=2) as r:
            data = json.load(r)
    except Exception:  # unreachable, refused, a torn or malformed answer: nothing to apply
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str) and ENV_NAME.match(k)}


def _lit(value):
    """A string literal R and Java read as `value` (JSON's escapes are a subset of theirs)."""
    return json.dumps(value)


def _r_setenv(items):
    names = ", ".join(_lit(k) for k in items)
    values = ", ".join(_lit(v) for v in items.values())
    return f"do.call(Sys.setenv, as.list(setNames(c({values}), c({names}))))\n"


class UnsupportedLanguage(Exception):
    pass


class ContextRemoved(Exception):
    pass


def normalise_language(language):
    language = (language or "").strip().lower() or "python"
    return ALIASES.get(language, language)


def available_languages():
    """The languages whose kernels this image has (R and Java are in code-interpreter-full)."""
    return sorted(lang for lang, spec in KERNELS.items()
                  if os.path.isdir(os.path.join(KERNEL_DIR, spec)))


def check_language(language):
    available = available_languages()
    if language not in available:
        hint = ""
        if language in KERNELS:
            hint = " (R and Java kernels are in the code-interpreter-full template)"
        raise UnsupportedLanguage(
            f"Language {language!r} is not supported by this sandbox{hint} "
            f"(available: {', '.join(available)})"
        )


def _kernel_env():
    env = dict(os.environ)
    # The server finds its own package through PYTHONPATH; user code should not inherit it.
    env.pop("PYTHONPATH", None)
    env.pop("WARREN_INTERP_LISTEN", None)
    # ipykernel's bundled debugger warns about frozen modules on every start otherwise.
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


class Context:
    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd or DEFAULT_CWD
        self.lock = threading.Lock()
        self.km = None
        self.kc = None
        # Set by Registry.remove: a removed context's kernel is never started again.
        self.removed = False
        # The environment the kernel has (as started, plus sandbox-wide variables applied).
        self.applied = {}

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    # --- kernel process -------------------------------------------------------------------

    def start(self):
        os.makedirs(self.cwd, exist_ok=True)
        km = KernelManager(kernel_name=KERNELS[self.language])
        env = _kernel_env()
        sandbox = sandbox_env()
        env.update(sandbox)
        km.start_kernel(cwd=self.cwd, env=env)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
        except RuntimeError:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc
        self.applied = env
        if self.language == "java" and sandbox:
            # Java code reads them as system properties (see _sandbox_env_code).
            self._run_quietly(self._sandbox_env_code(sandbox, reseed=False))

    def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:  # the process may already be gone
                pass
        self.km = self.kc = None

    def restart(self):
        """A fresh kernel for this context (same id, language and cwd)."""
        self.stop()
        if self.removed:
            raise ContextRemoved(f"Context {self.id} was removed")
        self.start()

    def alive(self):
        return self.km is not None and self.km.is_alive()

    # --- execution ------------------------------------------------------------------------

    def _run_quietly(self, code, deadline=30.0):
        """Runs helper code (env vars) without output or history; returns when it is done."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if not self.alive():
                    return
                continue
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"].get("execution_state") == "idle"
            ):
                return

    def _sandbox_env_code(self, items, reseed):
        """Code that sets `items` in the kernel's environment for good; with `reseed`, it
        also reseeds the language's global random generator from the (per-sandbox) kernel
        pool, so kernels restored from one snapshot stop producing the same numbers."""
        data = json.dumps(items)
        if self.language == "python":
            code = f"import os as _w_os, json as _w_json\n_w_os.environ.update(_w_json.loads({data!r}))\n"
            code += "del _w_os, _w_json\n"
            if reseed:
                code += "import random as _w_random\n_w_random.seed()\ndel _w_random\n"
            return code
        if self.language in NODE_LANGUAGES:
            return f"Object.assign(process.env, {data});\n"
        if self.language == "r":
            code = _r_setenv(items)
            if reseed:
                code += "\nset.seed(NULL)"
            return code
        if self.language == "java":
            # A JVM cannot change its own environment: E2B's Java kernels use system
            # properties (System.getProperty), and so do we.
            return "".join(f"System.setProperty({_lit(k)}, {_lit(v)});\n" for k, v in items.items())
        lines = []
        for k, v in items.items():
            quoted = "'" + v.replace("'", "'\\''") + "'"
            lines.append(f"export {k}={quoted}")
        if reseed:
            lines.append("RANDOM=$(( $(od -An -N2 -tu2 /dev/urandom) ))")
        return "\n".join(lines)

    def _env_code(self, env_vars):
        """(set, restore) code for per-execution environment variables in this language."""
        items = {k: str(v) for k, v in (env_vars or {}).items() if ENV_NAME.match(k)}
        if not items:
            return None, None
        if self.language == "python":
            data = json.dumps(items)
            set_code = (
                "import os as _w_os, json as _w_json\n"
                f"_w_env = _w_json.loads({data!r})\n"
                "_w_env_saved = {k: _w_os.environ.get(k) for k in _w_env}\n"
                "_w_os.environ.update(_w_env)\n"
                "del _w_env, _w_os, _w_json\n"
            )
            restore = (
                "import os as _w_os\n"
                "for _w_k, _w_v in _w_env_saved.items():\n"
                "    if _w_v is None: _w_os.environ.pop(_w_k, None)\n"
                "    else: _w_os.environ[_w_k] = _w_v\n"
                "del _w_env_saved, _w_os\n"
                "try: del _w_k, _w_v\nexcept NameError: pass\n"
            )
            return set_code, restore
        if self.language in NODE_LANGUAGES:
            data = json.dumps(items)
            set_code = (
                f"globalThis.__warrenEnv = {data};\n"
                "globalThis.__warrenEnvSaved = Object.fromEntries(Object.keys(__warrenEnv)"
                ".map((k) => [k, process.env[k]]));\n"
                "Object.assign(process.env, __warrenEnv); delete globalThis.__warrenEnv;\n"
            )
            restore = (
                "for (const [k, v] of Object.entries(__warrenEnvSaved)) {\n"
                "  if (v === undefined) delete process.env[k]; else process.env[k] = v\n"
                "}\ndelete globalThis.__warrenEnvSaved;\n"
            )
            return set_code, restore
        if self.language == "r":
            names = ", ".join(_lit(k) for k in items)
            set_code = (
                f".warren_env_saved <- Sys.getenv(c({names}), unset = NA, names = TRUE)\n"
                + _r_setenv(items)
            )
            restore = (
                "for (.warren_k in names(.warren_env_saved)) {\n"
                "  .warren_v <- .warren_env_saved[[.warren_k]]\n"
                "  if (is.na(.warren_v)) Sys.unsetenv(.warren_k)\n"
                "  else do.call(Sys.setenv, setNames(list(.warren_v), .warren_k))\n"
                "}\n"
                "rm(.warren_env_saved, .warren_k, .warren_v)\n"
            )
            return set_code, restore
        if self.language == "java":
            set_lines, restore_lines = [], []
            for i, (k, v) in enumerate(items.items()):
                set_lines.append(f"String __warrenEnvSaved{i} = System.setProperty({_lit(k)}, {_lit(v)});")
                restore_lines.append(
                    f"if (__warrenEnvSaved{i} == null) System.clearProperty({_lit(k)}); "
                    f"else System.setProperty({_lit(k)}, __warrenEnvSaved{i});"
                )
            return "\n".join(set_lines), "\n".join(restore_lines)
        # bash: remember whether each variable was set and its value, then export.
        set_lines, restore_lines = [], []
        for k, v in items.items():
            quoted = "'" + v.replace("'", "'\\''") + "'"
            set_lines.append(
                f'if [ -n "${{{k}+x}}" ]; then _w_had_{k}=1; _w_old_{k}="${k}"; '
                f"else _w_had_{k}=0; fi; export {k}={quoted}"
            )
            restore_lines.append(
                f'if [ "$_w_had_{k}" = 1 ]; then export {k}="$_w_old_{k}"; '
                f"else unset {k}; fi; unset _w_had_{k} _w_old_{k}"
            )
        return "\n".join(set_lines), "\n".join(restore_lines)

    def execute(self, code, env_vars, emit, client_gone):
        """Runs `code`, calling `emit(line)` for every wire line as output arrives.

        The caller holds `self.lock`. `emit` raises OSError when the client has gone;
        `client_gone()` polls for that between messages. Either way the kernel is interrupted
        so the next execution is not stuck behind this one. Returns restore code to run
        after the response is finished (per-execution env vars), or None.
        """
        if not self.alive():
            # Died while idle and the watcher has not caught it yet.
            self.restart()
        fresh = {k: v for k, v in sandbox_env().items() if self.applied.get(k) != v}
        if fresh:
            # Kept for good (no restore): they are the sandbox's from now on. A new sandbox
            # id means this kernel was started in a snapshot other sandboxes restore too.
            reseed = "E2B_SANDBOX_ID" in fresh
            self._run_quietly(self._sandbox_env_code(fresh, reseed))
            self.applied.update(fresh)
        set_env, restore_env = self._env_code(env_vars)
        if set_env:
            self._run_quietly(set_env)
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        last_write = time.monotonic()
        errored = False
        # Whether the kernel has picked the request up (any message in reply to it).
        started = False
        resent = False
        while True:
            if client_gone():
                self._interrupt(msg_id)
                return restore_env
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if not self.alive() and not started and not resent:
                    # It died before it saw the code (killed just before we sent it): the
                    # code has not run, so run it on a fresh kernel instead of failing it.
                    self.restart()
                    if set_env:
                        self._run_quietly(set_env)
                    msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
                    resent = True
                    continue
                if not self.alive():
                    emit(
                        output.error_line(
                            "KernelDied",
                            "The kernel of this context died while running this code "
                            "(killed, or out of memory). It was restarted; its state is lost.",
                            "",
                        )
                    )
                    self.restart()
                    return None
                if time.monotonic() - last_write >= KEEPALIVE_SECONDS:
                    try:
                        emit({"type": "keepalive"})
                    except OSError:
                        self._interrupt(msg_id)
                        return restore_env
                    last_write = time.monotonic()
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            started = True
            kind = msg["msg_type"]
            if kind == "status":
                state = msg["content"].get("execution_state")
                if state == "idle":
                    break
                if state == "restarting":
                    emit(output.error_line("ContextRestarting", "Context was restarted", ""))
                    return None
                continue
            line = output.translate(msg)
            if line is None:
                continue
            if line["type"] == "error":
                # Only the first error counts, as in a notebook cell.
                if errored:
                    continue
                errored = True
            try:
                emit(line)
            except OSError:
                self._interrupt(msg_id)
                return restore_env
            last_write = time.monotonic()
        if not errored and self._aborted(msg_id):
            emit(output.error_line("ExecutionAborted", "Execution was aborted", ""))
        emit({"type": "end_of_execution"})
        return restore_env

    def _aborted(self, msg_id):
        """Whether the kernel's execute_reply says the request was aborted."""
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                reply = self.kc.get_shell_msg(timeout=0.2)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"].get("status") == "aborted"
        return False

    def _interrupt(self, msg_id):
        """The client went away: stop the running code and wait for the kernel to be idle."""
        try:
            self.km.interrupt_kernel()
        except Exception:
            pass
        end = time.monotonic() + INTERRUPT_GRACE_SECONDS
        while time.monotonic() < end:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if not self.alive():
                    break
                continue
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"].get("execution_state") == "idle"
            ):
                return
        # Code that ignores SIGINT (or a dead kernel): a fresh kernel beats a stuck context.
        print(f"context {self.id}: still busy after an interrupt; restarting its kernel", flush=True)
        self.restart()

    def cleanup(self, restore_env):
        """After the response: undo per-execution env vars, then free the context."""
        try:
            if restore_env and self.alive():
                self._run_quietly(restore_env)
        finally:
            self.lock.release()


class Registry:
    """All contexts, plus the default context per language."""

    def __init__(self):
        self._lock = threading.Lock()
        self._contexts = {}
        self._defaults = {}

    def create(self, language, cwd, default=False):
        language = normalise_language(language)
        check_language(language)
        ctx = Context(language, cwd)
        ctx.start()
        with self._lock:
            self._contexts[ctx.id] = ctx
            if default:
                self._defaults[language] = ctx.id
        return ctx

    def get(self, context_id):
        with self._lock:
            return self._contexts.get(context_id)

    def default_for(self, language):
        language = normalise_language(language)
        check_language(language)
        with self._lock:
            ctx_id = self._defaults.get(language)
            ctx = self._contexts.get(ctx_id) if ctx_id else None
        if ctx is not None:
            return ctx
        # Created lazily on first use; two racing requests may both start one, the first
        # registered wins and the other is stopped.
        ctx = Context(language, DEFAULT_CWD)
        ctx.start()
        with self._lock:
            existing = self._contexts.get(self._defaults.get(language, ""))
            if existing is None:
                self._contexts[ctx.id] = ctx
                self._defaults[language] = ctx.id
                return ctx
        ctx.stop()
        return existing

    def list(self):
        with self._lock:
            return [c.describe() for c in self._contexts.values()]

    def remove(self, context_id):
        with self._lock:
            ctx = self._contexts.pop(context_id, None)
            for lang, cid in list(self._defaults.items()):
                if cid == context_id:
                    del self._defaults[lang]
        if ctx is None:
            return False
        ctx.removed = True
        ctx.stop()
        return True

    def watch(self, interval=1.0):
        """Forever: restart the kernel of any idle context whose kernel died."""
        while True:
            time.sleep(interval)
            with self._lock:
                contexts = list(self._contexts.values())
            for ctx in contexts:
                if not ctx.lock.acquire(blocking=False):
                    continue  # running code; the execution loop watches that kernel
                try:
                    if ctx.km is not None and not ctx.alive():
                        ctx.restart()
                except Exception as e:  # keep watching the others
                    print(f"restarting context {ctx.id} failed: {e}", flush=True)
                finally:
                    ctx.lock.release()
