#!/usr/bin/env python3
"""Test-harness wrapper around the vendor build of Terraform v0.15.0-rc2, the one real terraform
binary these machines can install. It absorbs that build's quirks so Terrace's code never has to:

- stdout lines may be prefixed with "o:" or "e:"   -> stripped (some errors go to stdout)
- [TRACE]/[DEBUG]/… log records on stderr           -> dropped, continuation lines too
- `apply PLANFILE` applies nothing (the build prunes every node of a saved plan)
                                                    -> re-planned: `apply -auto-approve`, or
                                                       `destroy -auto-approve` for a destroy plan

Signals: the wrapper shares terraform's process group, so SIGINT reaches terraform directly;
the wrapper itself ignores SIGINT/SIGTERM and exits with terraform's exit code.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading

REAL = os.path.join(os.path.dirname(os.path.realpath(__file__)), "terraform-0.15.0-rc2")
LOG_LINE = re.compile(rb"^\[(TRACE|DEBUG|INFO|WARN|ERR|ERROR)\] ")
# terraform's own diagnostics: "Error: ...", "Warning: ...", or the box-drawn form (│ ╷ ╵).
USER_LINE = re.compile(rb"^(Error|Warning): |^(\xe2\x94\x82|\xe2\x95\xb7|\xe2\x95\xb5)")


class LogFilter:
    """Drops log records, including their continuation lines, until terraform's own
    diagnostics (`Error: ...`, `Warning: ...`) start again."""

    def __init__(self):
        self.in_record = False

    def __call__(self, line):
        if LOG_LINE.match(line):
            self.in_record = True
            return None
        if self.in_record and USER_LINE.match(line):
            self.in_record = False
        return None if self.in_record else line


def strip_prefix(line: bytes) -> bytes:
    return line[2:] if line.startswith((b"o:", b"e:")) else line


def saved_plan_to_replan(args):
    """`apply [flags] PLAN` -> the same change without the saved plan:
    - a plan that only deletes: `destroy -auto-approve -target=ADDR ...` (exactly those);
    - a destroy plan of an empty workspace: `destroy -auto-approve` (nothing to do);
    - anything else: `apply -auto-approve` (re-planned from the same configuration)."""
    positional = [a for a in args[1:] if not a.startswith("-")]
    if not positional or not os.path.isfile(positional[-1]):
        return args
    shown = subprocess.run([REAL, "show", "-json", positional[-1]], capture_output=True)
    text = b"".join(strip_prefix(l) for l in shown.stdout.splitlines(keepends=True))
    plan = json.loads(text)
    flags = [a for a in args[1:] if a.startswith("-")]
    deletes, others = [], []
    for rc in plan.get("resource_changes", []):
        actions = rc["change"]["actions"]
        if "delete" in actions and all(a in ("delete", "no-op", "read") for a in actions):
            deletes.append(rc["address"])
        elif any(a not in ("no-op", "read") for a in actions):
            others.append(rc["address"])
    planned = plan.get("planned_values", {}).get("root_module", {})
    if deletes and not others:
        return ["destroy", "-auto-approve"] + flags + ["-target=" + a for a in deletes]
    if not others and not planned.get("resources") and not planned.get("child_modules"):
        return ["destroy", "-auto-approve"] + flags
    return ["apply", "-auto-approve"] + flags


def copy(src, dst, keep):
    for line in iter(src.readline, b""):
        line = keep(line)
        if line is not None:
            dst.write(line)
            dst.flush()


def die_with_parent():
    """In the child before exec: SIGKILL it when the wrapper dies, as the runner does for the
    wrapper, so terraform never outlives whoever started it."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main():
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: None)
    args = sys.argv[1:]
    if args and args[0] == "apply":
        args = saved_plan_to_replan(args)
    child = subprocess.Popen(
        [REAL] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent
    )
    threads = [
        threading.Thread(target=copy, args=(child.stdout, sys.stdout.buffer, strip_prefix)),
        threading.Thread(
            target=copy,
            args=(child.stderr, sys.stderr.buffer, LogFilter()),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
