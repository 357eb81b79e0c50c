"""Coming from verl: convert a verl DAPO recipe's config keys to a RunConfig (`asyncdapo config from-verl`)."""

from asyncdapo.from_verl.convert import Conversion, VerlKeys, convert, read_sources
from asyncdapo.from_verl.keys import RULES, keys_table

__all__ = ["RULES", "Conversion", "VerlKeys", "convert", "keys_table", "read_sources"]
