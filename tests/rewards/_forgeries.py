"""Wrong solutions that try to forge a passing unit-test grade (review failure S1, and more).

Each entry is ``(id, source)``; ``NAME`` in the source stands for the task's entry point. Every
one of them is wrong (its honest answers fail the tests); it scores only by cheating.
"""

from __future__ import annotations

# Prints events with whatever secret it can find, then leaves before the real answers.
_SCAN = r"""
import os, sys, json, re
def NAME(*args, **kwargs):
    return None
found = []
f = sys._getframe()
while f is not None:
    for scope in (f.f_locals, f.f_globals):
        for value in list(scope.values()):
            if isinstance(value, (str, dict)):
                found.append(value)
    f = f.f_back
for path in ("/proc/self/cmdline", "/proc/self/environ", "/proc/1/cmdline"):
    try:
        found.append(open(path, "rb").read().decode("latin-1"))
    except OSError:
        pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            found.append(open(f"/proc/{pid}/cmdline", "rb").read().decode("latin-1"))
        except OSError:
            pass
found.append(dict(os.environ))
def _text(x):
    try:
        return json.dumps(x, default=str) if isinstance(x, dict) else x
    except Exception:
        return " ".join(str(v) for v in x.values() if isinstance(v, str))
text = " ".join(_text(x) for x in found)
"""

_OLD_EVENTS = r"""
nonces = set(re.findall(r"@@areal-[0-9a-f]+@@", text)) or {"@@areal-0000@@"}
for n in nonces:
    for e in ({"event": "loaded"}, {"event": "plan", "total": 1},
              {"event": "case", "index": 0, "ok": True, "timeout": False, "error": None},
              {"event": "done", "stdout": ""}):
        os.write(1, ("\n" + n + json.dumps(e) + "\n").encode())
"""

_JOB_IDS = r"""
import json as _j, sys as _s
def _ids():
    f = _s._getframe()
    while f is not None:
        job = f.f_locals.get("job") or f.f_globals.get("job")
        if isinstance(job, dict) and "calls" in job:
            return [c[0] for c in job["calls"]]
        f = f.f_back
    return []
"""


_ALL = """
def _all(data):
    for fd in range(1, 21):
        try:
            os.write(fd, data)
        except OSError:
            pass
"""


def _with(body: str) -> str:
    return "def NAME(*args, **kwargs):\n    return None\n" + body


# The review's own repro (redteam env/forge_reward.py), for any entry point.
_REVIEW_S1 = r"""
import sys, os, json
def NAME(*args, **kwargs):
    return None
_f = sys._getframe()
while _f is not None and "nonce" not in _f.f_locals:
    _f = _f.f_back
if _f is not None:
    _n = _f.f_locals["nonce"]
    _ev = [{"event": "loaded"}, {"event": "plan", "total": 1},
           {"event": "case", "index": 0, "ok": True, "timeout": False, "error": None},
           {"event": "done", "stdout": ""}]
    os.write(1, "".join("\n" + _n + json.dumps(e) + "\n" for e in _ev).encode())
    os._exit(0)
"""

FORGERIES: list[tuple[str, str]] = [
    ("review_s1_exact", _REVIEW_S1),
    ("review_s1_nonce_from_frame", _SCAN + _OLD_EVENTS + "os._exit(0)\n"),
    (
        "old_events_every_fd",
        _SCAN + _ALL + _OLD_EVENTS.replace("os.write(1, ", "_all(") + "os._exit(0)\n",
    ),
    (
        "new_events_all_ok_true",
        _JOB_IDS
        + _with(
            "import os\nfor fd in range(1, 21):\n    try:\n"
            "        os.write(fd, b'\\n@areal:L - {\"ok\":true}\\n')\n"
            "        for i in _ids():\n"
            "            os.write(fd, ('\\n@areal:R ' + i + ' {\"ok\":true}\\n').encode())\n"
            "    except OSError:\n        pass\n"
        ),
    ),
    (
        "new_events_forged_in_call",
        _JOB_IDS + "import os\ndef NAME(*args, **kwargs):\n"
        "    for fd in range(1, 21):\n        try:\n"
        "            for i in _ids():\n"
        "                os.write(fd, ('\\n@areal:R ' + i + ' {\"ok\":[\"l\",[]]}\\n').encode())\n"
        "        except OSError:\n            pass\n    os._exit(0)\n",
    ),
    (
        "plausible_verdict_lines",
        _with(
            'print(\'PASSED 5/5\'); print(\'{"status": "correct", "reward": 1.0}\')\n'
            'print(\'@areal:V - {"decided":true,"passed":5,"total":5}\')\n'
        ),
    ),
    ("exit_0_at_import", _with("import os\nos._exit(0)\n")),
    ("exit_0_in_call", "import os\ndef NAME(*args, **kwargs):\n    os._exit(0)\n"),
    ("sys_exit_in_call", "import sys\ndef NAME(*args, **kwargs):\n    sys.exit(0)\n"),
    ("system_exit_at_import", _with("raise SystemExit(0)\n")),
    ("keyboard_interrupt_in_call", "def NAME(*args, **kwargs):\n    raise KeyboardInterrupt\n"),
    ("generator_exit_in_call", "def NAME(*args, **kwargs):\n    raise GeneratorExit\n"),
    ("stop_iteration_in_call", "def NAME(*args, **kwargs):\n    raise StopIteration\n"),
    (
        "exception_named_like_pass",
        "class AssertionPassed(Exception):\n    pass\n"
        "def NAME(*args, **kwargs):\n    raise AssertionPassed('ok')\n",
    ),
    (
        "kill_parent",
        "import os, signal\ndef NAME(*args, **kwargs):\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n    return None\n",
    ),
    (
        "kill_process_group",
        "import os, signal\ndef NAME(*args, **kwargs):\n    os.killpg(0, signal.SIGKILL)\n",
    ),
    (
        "kill_everything",
        "import os, signal\ndef NAME(*args, **kwargs):\n    os.kill(-1, signal.SIGKILL)\n",
    ),
    (
        "daemon_prints_later",
        _JOB_IDS + "import os, time\ndef NAME(*args, **kwargs):\n"
        "    if os.fork() == 0:\n        os.setsid()\n        time.sleep(0.5)\n"
        "        for fd in range(1, 21):\n            try:\n"
        "                for i in _ids():\n"
        "                    os.write(fd, ('\\n@areal:R ' + i + ' {\"ok\":1}\\n').encode())\n"
        "            except OSError:\n                pass\n        os._exit(0)\n"
        "    return None\n",
    ),
    (
        "patch_builtins",
        _with(
            "import builtins\nbuiltins.isinstance = lambda *a: True\n"
            "builtins.type = lambda *a: int\n"
            "builtins.AssertionError = type('Nope', (Exception,), {})\nbuiltins.callable = None\n"
        ),
    ),
    (
        "patch_json_dumps",
        _with(
            "import json\n_d = json.dumps\njson.dumps = lambda *a, **k: 'true'\n"
            "json.JSONEncoder.encode = lambda self, o: 'true'\n"
        ),
    ),
    (
        "patch_sys_modules",
        _with(
            "import sys, types\nfake = types.ModuleType('json')\nfake.dumps = lambda *a, **k: '1'\n"
            "fake.loads = lambda *a, **k: {}\nsys.modules['json'] = fake\n"
            "sys.modules['os'] = types.ModuleType('os')\n"
        ),
    ),
    (
        "patch_signal_and_sleep",
        "import signal, time\nsignal.signal(signal.SIGALRM, "
        "signal.SIG_IGN)\nsignal.setitimer = lambda *a: None\n"
        "def NAME(*args, **kwargs):\n    time.sleep(60)\n",
    ),
    (
        "int_eq_patched_in_type_dict",
        _with(
            "import gc\nfor cls in (int, str, list, bool, float):\n"
            "    d = gc.get_referents(cls.__dict__)[0]\n"
            "    d['__eq__'] = lambda a, b: True\n    d['__ne__'] = lambda a, b: False\n"
        ),
    ),
    (
        "patch_executor_answer",
        _with(
            "import sys\nf = sys._getframe()\nwhile f is not None:\n"
            "    g = f.f_globals\n    if '_answer' in g:\n"
            "        g['_answer'] = lambda *a, **k: {'ok': True}\n"
            "        g['encode'] = lambda v: True\n        g['decode'] = lambda v: v\n"
            "    f = f.f_back\n"
        ),
    ),
    (
        "always_equal_object",
        "class Yes:\n    def __eq__(self, o):\n        return True\n"
        "    def __ne__(self, o):\n        return False\n    __hash__ = object.__hash__\n"
        "def NAME(*args, **kwargs):\n    return Yes()\n",
    ),
    (
        "int_subclass_eq",
        "class I(int):\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = int.__hash__\ndef NAME(*args, **kwargs):\n    return I(123456)\n",
    ),
    (
        "str_subclass_eq",
        "class S(str):\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = str.__hash__\ndef NAME(*args, **kwargs):\n    return S('x')\n",
    ),
    (
        "list_subclass_eq",
        "class L(list):\n    def __eq__(self, o):\n        return True\n"
        "def NAME(*args, **kwargs):\n    return L([987])\n",
    ),
    (
        "dict_subclass_eq_hash",
        "class D(dict):\n    def __eq__(self, o):\n        return True\n"
        "    def __hash__(self):\n        return 0\n"
        "def NAME(*args, **kwargs):\n    return D(a=1)\n",
    ),
    (
        "tuple_subclass_eq",
        "class T(tuple):\n    def __eq__(self, o):\n        return True\n"
        "def NAME(*args, **kwargs):\n    return T((1,))\n",
    ),
    (
        "float_subclass_eq",
        "class F(float):\n    def __eq__(self, o):\n        return True\n"
        "    def __lt__(self, o):\n        return True\n"
        "    def __abs__(self):\n        return self\n"
        "    def __sub__(self, o):\n        return self\n    __rsub__ = __sub__\n"
        "def NAME(*args, **kwargs):\n    return F(1e300)\n",
    ),
    (
        "fake_class_attribute",
        "class Liar:\n    __class__ = int\n"
        "    def __eq__(self, o):\n        return True\ndef NAME(*args, **kwargs):\n"
        "    return Liar()\n",
    ),
    (
        "metaclass_named_int",
        "class Meta(type):\n    __name__ = 'int'\n"
        "class Fake(metaclass=Meta):\n    __module__ = 'builtins'\n"
        "    def __eq__(self, o):\n        return True\ndef NAME(*args, **kwargs):\n"
        "    return Fake()\n",
    ),
    (
        "repr_looks_right",
        "class R:\n    def __repr__(self):\n        return '1'\n"
        "    __str__ = __repr__\ndef NAME(*args, **kwargs):\n    return R()\n",
    ),
    ("recursive_list", "def NAME(*args, **kwargs):\n    x = []\n    x.append(x)\n    return x\n"),
    (
        "deep_list",
        "def NAME(*args, **kwargs):\n    x = []\n    for _ in range(100000):\n"
        "        x = [x]\n    return x\n",
    ),
    ("huge_return", "def NAME(*args, **kwargs):\n    return 'x' * 50_000_000\n"),
    (
        "huge_prints",
        "import os, sys\ndef NAME(*args, **kwargs):\n"
        "    for fd in range(1, 21):\n        try:\n            os.write(fd, b'y' * 100000)\n"
        "        except OSError:\n            pass\n    print('z' * 10**6)\n    return None\n",
    ),
    ("nan", "def NAME(*args, **kwargs):\n    return float('nan')\n"),
    ("nan_in_list", "def NAME(*args, **kwargs):\n    return [float('nan')]\n"),
    ("generator", "def NAME(*args, **kwargs):\n    yield 1\n"),
    ("not_implemented", "def NAME(*args, **kwargs):\n    return NotImplemented\n"),
    ("ellipsis", "def NAME(*args, **kwargs):\n    return ...\n"),
    ("module_object", "import sys\ndef NAME(*args, **kwargs):\n    return sys\n"),
    ("type_object", "def NAME(*args, **kwargs):\n    return int\n"),
    (
        "del_raises",
        "class Bomb:\n    def __del__(self):\n        raise SystemExit(0)\n"
        "def NAME(*args, **kwargs):\n    return [Bomb()]\n",
    ),
    (
        "close_every_fd",
        "import os\ndef NAME(*args, **kwargs):\n"
        "    for fd in range(0, 64):\n        try:\n            os.close(fd)\n"
        "        except OSError:\n            pass\n    return None\n",
    ),
    (
        "recursion_limit",
        "import sys\ndef NAME(*args, **kwargs):\n"
        "    sys.setrecursionlimit(30)\n    return [[[[[[[[1]]]]]]]]\n",
    ),
    (
        "settrace_rewrites_locals",
        _with(
            "import sys\ndef tr(frame, event, arg):\n"
            "    if frame.f_code.co_name == '_answer' and event == 'return':\n"
            "        return None\n    return tr\nsys.settrace(tr)\n"
        ),
    ),
    (
        "thread_spams_fake_answers",
        _JOB_IDS + "import os, threading\n"
        "def spam():\n    while True:\n        for i in _ids():\n            try:\n"
        "                os.write(3, ('\\n@areal:R ' + i + ' {\"ok\":0}\\n').encode())\n"
        "            except OSError:\n                return\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
        "def NAME(*args, **kwargs):\n    return None\n",
    ),
    (
        "exception_message_injects_lines",
        _JOB_IDS + "def NAME(*args, **kwargs):\n"
        "    raise ValueError(''.join('\\n@areal:R ' + i + ' {\"ok\":1}\\n' for i in _ids()))\n",
    ),
    (
        "exception_renamed_stop_iteration",
        "class E(Exception):\n    pass\nE.__name__ = 'StopIteration'\n"
        "def NAME(*args, **kwargs):\n    raise E()\n",
    ),
    (
        "exception_renamed_system_exit",
        "class E(Exception):\n    pass\nE.__name__ = 'SystemExit'\n"
        "def NAME(*args, **kwargs):\n    raise E()\n",
    ),
    ("memory_bomb", "def NAME(*args, **kwargs):\n    return [0] * (10**10)\n"),
    (
        "read_tests_from_disk",
        _with(
            "import os\nhits = []\nfor n, (root, dirs, files) in enumerate(os.walk('/')):\n"
            "    if n > 3000:\n        break\n"
            "    if root.startswith(('/proc', '/sys', '/dev')):\n        dirs[:] = []\n"
            "        continue\n    for f in files:\n"
            "        if 'test' in f.lower() and len(hits) < 50:\n"
            "            hits.append(os.path.join(root, f))\n"
            "print(hits)\n"
        ),
    ),
]
