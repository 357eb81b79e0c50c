"""A reader for the part of bash that verl's recipe scripts are written in, so that
`from_verl.shell` can read the trainer's `key=value` arguments. Nothing is executed.

`parse` builds the tree of `syntax` from the words and operators of `lexer`. `interpreter` runs
it: assignments, control flow and functions, with `expansion` for words (`arith` for `$(( ))`,
`patterns` for globs), `conditions` for `[ ]`/`[[ ]]`/`test` and `builtins` for the commands it
runs itself (`coreutils` for the text work of echo/printf/expr/basename/dirname); it records
the commands it does not run. `values` holds what it knows and hands back (a value or why it
cannot be known), `control_flow` the exceptions for exit/return/break/continue."""
