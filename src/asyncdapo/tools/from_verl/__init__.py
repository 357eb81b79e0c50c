"""Coming from verl: convert a verl recipe (DAPO, GRPO, one-step-off, fully-async) to the run
config verl would run (`asyncdapo config from-verl`)."""

from asyncdapo.tools.from_verl.convert import Conversion, VerlKeys, convert, read_sources, resolve_entry
from asyncdapo.tools.from_verl.entries import Entry
from asyncdapo.tools.from_verl.keys import MAPPED, RULES, keys_table, rule_for
from asyncdapo.tools.from_verl.view import VerlRecipeError

__all__ = [
    "MAPPED",
    "RULES",
    "Conversion",
    "Entry",
    "VerlKeys",
    "VerlRecipeError",
    "convert",
    "keys_table",
    "read_sources",
    "resolve_entry",
    "rule_for",
]
