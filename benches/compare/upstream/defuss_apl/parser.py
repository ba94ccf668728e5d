"""`parse_apl` and `ValidationError`. defuss-apl's parser returns its own step objects;
aplc has no such objects, so the tests that inspect them are not applicable (see
../not_applicable.txt). `parse_apl` validates like defuss-apl's (no relaxed syntax)."""

from typing import Dict

import aplc

from .runtime import DIALECT

ValidationError = aplc.ValidationError


def parse_apl(template: str) -> Dict[str, object]:
    aplc.check(template, relaxed=False, dialect=DIALECT)
    return {}
