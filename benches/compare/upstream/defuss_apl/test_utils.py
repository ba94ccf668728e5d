"""The upstream suite's test fixtures (mock and echo providers). They are part of the
tests, not of the runtime under test, so they are loaded from the upstream checkout
(`DEFUSS_APL_TEST_UTILS`, set by run.sh) into this package: their `from .tools import
call_tools` then calls aplc's."""

import os
import sys

_path = os.environ.get("DEFUSS_APL_TEST_UTILS")
if not _path or not os.path.isfile(_path):
    raise ImportError("set DEFUSS_APL_TEST_UTILS to defuss-apl's test_utils.py (run.sh does)")
with open(_path, encoding="utf-8") as _f:
    exec(compile(_f.read(), _path, "exec"), sys.modules[__name__].__dict__)
