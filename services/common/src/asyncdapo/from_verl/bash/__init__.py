"""A reader for the part of bash that verl's recipe scripts are written in: `parse` parses a
script; `interpreter` runs its assignments, conditions and value-producing commands as bash would
(with `arith` for `$(( ))`, `patterns` for globs and `coreutils` for echo/printf/expr/basename/
dirname) and records the commands it does not run, so that `from_verl.shell` can read the
trainer's `key=value` arguments. Nothing is executed."""
