"""Drives `aplc` on a pseudo-terminal, as a person at a terminal would
(cli/tests/human_process.rs): waits for each expected text on the terminal, then types
an answer. Prints one JSON object on stdout: the exit code (null if it had to be
killed), what the terminal showed, and whether anything was drawn while a question
waited for an answer.

argv[1] is a JSON object: {"argv": [...], "cwd": DIR, "stdout": FILE, "env": {...},
"steps": [{"expect": TEXT, "send": TEXT, "quiet_ms": N, "kill9": BOOL}],
"end_within_s": N}.
aplc's stdout goes to FILE, so the terminal holds only what it shows on stderr (and the
echo of what was typed). `quiet_ms`: after TEXT appeared, watch the terminal this long
before typing, and report what was drawn meanwhile. `kill9`: SIGKILL aplc once TEXT
appeared, and report that.
"""
import json
import os
import pty
import select
import signal
import sys
import time

spec = json.loads(sys.argv[1])
pid, fd = pty.fork()
if pid == 0:
    os.chdir(spec["cwd"])
    out = os.open(spec["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    env = dict(os.environ)
    env.update(spec.get("env", {}))
    for name in ("APLC_STORE", "OPENAI_API_KEY"):
        env.pop(name, None)
    os.execve(spec["argv"][0], spec["argv"], env)

seen = b""
ended = False


def read_for(seconds):
    """Reads what the terminal shows for up to `seconds`; False once it ended."""
    global seen, ended
    end = time.time() + seconds
    while not ended:
        left = end - time.time()
        if left <= 0:
            return True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if not data:
            ended = True
            return False
        seen += data
    return False


def finish(result):
    result["seen"] = seen.decode("utf-8", "replace")
    print(json.dumps(result))
    sys.exit(0)


position = 0
drawn_while_asking = []
for step in spec["steps"]:
    expected = step["expect"].encode()
    deadline = time.time() + 60
    while seen.find(expected, position) < 0:
        if ended or time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            finish({"code": None, "error": "never showed %r" % step["expect"]})
        read_for(0.2)
    position = seen.find(expected, position) + len(expected)
    if step.get("quiet_ms"):
        before = len(seen)
        read_for(step["quiet_ms"] / 1000)
        if len(seen) > before:
            drawn_while_asking.append(seen[before:].decode("utf-8", "replace"))
    if step.get("kill9"):
        # SIGKILL while the question waits: no handler, no flush, no goodbye.
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        finish({"code": None, "killed": True, "drawn": drawn_while_asking})
    os.write(fd, step["send"].encode())

deadline = time.time() + spec.get("end_within_s", 60)
while not ended and time.time() < deadline:
    read_for(0.2)
if not ended:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    finish({"code": None, "error": "still running", "drawn": drawn_while_asking})
_, status = os.waitpid(pid, 0)
finish({"code": os.waitstatus_to_exitcode(status), "drawn": drawn_while_asking})
