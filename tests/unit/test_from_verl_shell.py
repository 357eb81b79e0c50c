"""Reading a verl recipe script the way bash runs it: each expansion is checked against what bash
itself passes to the trainer for the same script (bash runs it here with `python3` replaced by a
function that prints its arguments, and with `set -u`, as recipes set); what cannot be known is
an error that names the text, its line and the key it affects, and fails nothing it does not affect."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from asyncdapo.tools.from_verl.shell import ShellRead, read_script

BASH = shutil.which("bash") or "/bin/bash"
ENV = {"HOME": "/home/verl", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
OVERRIDE = re.compile(r"\+{0,2}[A-Za-z_][\w-]*(\.[\w-]+)+=")
TRAINER = "python3 -m verl.trainer.main_ppo"


def _script(setup: str, args: str, trainer: str = TRAINER) -> str:
    return f"set -euo pipefail\n{textwrap.dedent(setup).strip()}\n{trainer} {args}\n"


def _bash(script: str, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    """The trainer's key=value arguments as bash passes them."""
    path = cwd / "recipe.sh"
    path.write_text('python3() { shift 2; printf "%s\\0" "$@"; }\n' + script)
    proc = subprocess.run(
        [BASH, "recipe.sh"], cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return [a for a in proc.stdout.split("\0")[:-1] if OVERRIDE.match(a)]


def _read(script: str, cwd: Path, env: dict[str, str] | None = None) -> ShellRead:
    return read_script(script, env={**ENV, **(env or {})}, cwd=str(cwd), path="recipe.sh")


def _same_as_bash(setup: str, args: str, tmp_path: Path, env: dict[str, str] | None = None) -> ShellRead:
    cwd = tmp_path.resolve()
    script = _script(setup, args)
    read = _read(script, cwd, env)
    assert read.errors == []
    assert read.overrides == _bash(script, cwd, env)
    assert read.entry == "verl.trainer.main_ppo"
    return read


ARITHMETIC = {
    "fully-async's parenthesised total": ("", "rollout.total_rollout_steps=$(((512*100)))"),
    "nesting and precedence": (
        "max_prompt_length=$((1024 * 2))\nmax_response_length=$((1024 * 8))",
        "a.b=$(((max_prompt_length + max_response_length) * 2)) a.c=$(( (1+2)*(3+4) )) a.d=$((2**10))"
        " a.e=$((-2**2)) a.f=$((7/2)) a.g=$((-7/2)) a.h=$((-7%3)) a.i=$((+5 - -3)) a.j=$((2**63))",
    ),
    "comparisons, logic, ternary, bits": (
        "n=8",
        "a.b=$((n > 4)) a.c=$((n == 8 && n != 3)) a.d=$((n < 4 || 0)) a.e=$((n >= 8 ? 100 : 200))"
        " a.f=$((!n)) a.g=$((n & 3 | 4 ^ 1)) a.h=$((1 << 4 >> 1)) a.i=$((~n)) a.j=$((0 && 1/0))",
    ),
    "names with and without $, values that are expressions": (
        "NGPUS_PER_NODE=8\nn_gpus_rollout=2\nhalf=4/2",
        "trainer.n_gpus_per_node=$((NGPUS_PER_NODE - n_gpus_rollout)) a.b=$(($NGPUS_PER_NODE * ${n_gpus_rollout}))"
        " a.c=$((half * 3)) a.d=$(($half * 3)) a.e=$((0x10 + 010 + 2#101))",
    ),
    "assignments inside": ("i=1", "a.b=$((i += 4)) a.c=$i a.d=$((i++)) a.e=$i a.f=$((x = 3, x * 2))"),
}

PARAMETERS = {
    "defaults": (
        'EMPTY=""\nSET=v',
        "a.b=${UNSET:-d} a.c=${EMPTY:-d} a.d=${EMPTY-d}x a.e=${UNSET-d} a.f=${SET:-d} a.g=${SET:+alt}"
        " a.h=${EMPTY:+alt}x a.i=${UNSET:+alt}x a.j=${UNSET:-$SET/$SET}",
    ),
    "nested defaults": (
        'RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}',
        'actor_rollout_ref.model.path=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-Math-7B"}'
        ' a.b="${X:-"${Y:-deep} x"}" a.c="${X:-\'single\'}" a.d=${X:-\'single\'}',
    ),
    ":= assigns": ("", "a.b=${NEW:=assigned} a.c=$NEW a.d=${NEW:=again}"),
    "length and case": (
        "name=Qwen2.5-Math",
        "a.b=${#name} a.c=${name,,} a.d=${name^^} a.e=${name,} a.f=${name^} a.g=${name^^[aeiou]}",
    ),
    "prefix and suffix patterns": (
        "p=/models/Qwen/Qwen2.5-7B.tar.gz",
        "a.b=${p#*/} a.c=${p##*/} a.d=${p%.*} a.e=${p%%.*} a.f=${p#/models/[A-Z]wen} a.g=${p%%[.]*}"
        ' a.h="${p#"/models"}" a.i=${p#/models/?wen} a.j="${p%"*"}" a.k=${p##*[[:digit:]]}',
    ),
    "replacement": (
        "m=Qwen2.5-Math-7B",
        'a.b=${m/-/_} a.c=${m//-/_} a.d=${m//[.-]/} a.e=${m/#Qwen/qwen} a.f=${m/%7B/8B} a.g="${m/Math/<&>}"'
        " a.h=${m//?/x} a.i=${m/Math} a.j=${m//\\-/+}",
    ),
    "substrings": ("s=abcdef", "a.b=${s:2} a.c=${s:1:3} a.d=${s: -2} a.e=${s:0:-1} a.f=${s:10}"),
    "quoting": (
        "v='a b'",
        'a.b="$v" a.c=\'$v\' a.d=\\$v a.e="x\\"y" a.f=\'["console","wandb"]\' a.g=[\'console\',\'wandb\']'
        ' a.h="${v}"\'$v\'$v a.i=$\'tab\\there\' a.j="a\\\\b\\c" a.k="$v"\'"\'',
    ),
}

COMMANDS = {
    "echo, printf, expr, backquotes": (
        "",
        'a.b=$(echo hi) a.c=$(printf "%s-%d" x 42) a.d=$(expr 1024 \\* 4) a.e=$(expr 10 / 3)'
        ' a.f=`echo back` a.g=$(echo $(echo nested)) a.h=$(printf "%05.2f" 3.14159) a.i=$(echo -n "a  b")'
        ' a.j="$(printf "%s,%s;" 1 2 3)" a.k=$(expr \\( 2 + 3 \\) \\* 4)',
    ),
    "basename, dirname, pwd": (
        "MODEL_PATH=/models/Qwen2.5-7B-Instruct/\nWORK=$(pwd)",
        "trainer.experiment_name=$(basename $MODEL_PATH) a.b=$(basename /x/model.tar.gz .tar.gz)"
        ' a.c=$(dirname "$MODEL_PATH") a.d=$WORK a.e=$PWD a.f=$(cd .. && pwd) a.g="$(cd "$(dirname "$0")" && pwd)"'
        ' a.h=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) a.i=$(dirname x) a.j=$(basename "${MODEL_PATH}")',
    ),
}

ASSIGNMENTS = {
    "export, declare, +=, local": (
        """
        export A=1 B=2
        export C
        C=3
        declare D=4
        readonly E=5
        F=6
        F+=7
        set_h() { local G=8; H=$G; }
        set_h
        """,
        "a.a=$A a.b=$B a.c=$C a.d=$D a.e=$E a.f=$F a.h=$H a.g=${G:-unset}",
    ),
    "arrays": (
        """
        DATA=(
            data.x=1      # a comment inside
            'data.y=a b'
        )
        DATA+=(data.z=3)
        one=(x y z)
        """,
        '"${DATA[@]}" a.n=${#DATA[@]} a.s="${one[*]}" a.i=${one[1]} a.l=${one[-1]} a.f=$one',
    ),
    "word splitting of unquoted values": (
        'EXTRA="data.p=1  data.q=2"\nEMPTY=',
        '$EXTRA a.b="$EXTRA" $EMPTY "$@"',
    ),
    "tilde": ("DATA=~/data", "data.train_files=$DATA/train.parquet a.b=~/x a.c=x~"),
}

CONDITIONS = {
    "if, elif, else on one line": (
        'backend=megatron; if [ "$backend" = fsdp ]; then s=fsdp2; elif [ "$backend" == megatron ]; then s=mcore; else s=none; fi',
        "a.s=$s",
    ),
    "if over several lines, [[ ]], test, numbers": (
        """
        n=8
        name=megatron
        if [[ $name == meg* && -n $name ]]; then
            a=glob
        fi
        if test "$n" -ge 8 && [ "$n" -ne 9 ] && [ ! "$n" -lt 2 ]; then
            b=numbers
        else
            b=no
        fi
        if [ -z "${UNSET:-}" ] || [ "$n" -gt 100 ]; then c=or; fi
        if [ "$n" -le 7 -o "$name" != megatron ]; then d=yes; else d=no; fi
        if [[ ! ( $n -lt 3 || $name < a ) ]]; then e=paren; fi
        if [[ $n -eq 4*2 ]]; then f=arith; fi
        """,
        "a.a=$a a.b=$b a.c=$c a.d=$d a.e=$e a.f=$f",
    ),
    "&& and || lists": (
        'x=3\n[ -z "${Q:-}" ] && r=empty || r=full\ntest $x -gt 5 && s=big || s=small',
        "a.r=$r a.s=$s",
    ),
    "case": (
        'case "qwen2.5-7b.py" in *.sh) k=sh ;; *.py|*.pyc) k=py ;; *) k=other ;; esac',
        "a.k=$k",
    ),
    "for over words, arithmetic command": (
        'acc=""\nfor i in a "b c" d; do acc="$acc-$i"; done\n(( ${#acc} > 3 )) && long=yes',
        'a.acc="$acc" a.long=$long',
    ),
}


@pytest.mark.parametrize(("setup", "args"), ARITHMETIC.values(), ids=ARITHMETIC.keys())
def test_arithmetic_as_bash(setup: str, args: str, tmp_path: Path) -> None:
    _same_as_bash(setup, args, tmp_path)


@pytest.mark.parametrize(("setup", "args"), PARAMETERS.values(), ids=PARAMETERS.keys())
def test_parameter_expansion_as_bash(setup: str, args: str, tmp_path: Path) -> None:
    _same_as_bash(setup, args, tmp_path)


@pytest.mark.parametrize(("setup", "args"), COMMANDS.values(), ids=COMMANDS.keys())
def test_command_substitution_as_bash(setup: str, args: str, tmp_path: Path) -> None:
    _same_as_bash(setup, args, tmp_path)


@pytest.mark.parametrize(("setup", "args"), ASSIGNMENTS.values(), ids=ASSIGNMENTS.keys())
def test_assignments_as_bash(setup: str, args: str, tmp_path: Path) -> None:
    _same_as_bash(setup, args, tmp_path)


@pytest.mark.parametrize(("setup", "args"), CONDITIONS.values(), ids=CONDITIONS.keys())
def test_conditions_as_bash(setup: str, args: str, tmp_path: Path) -> None:
    _same_as_bash(setup, args, tmp_path)


def test_the_environment_comes_first_and_the_script_may_keep_it(tmp_path: Path) -> None:
    setup = """
    MODEL_PATH=${MODEL_PATH:-"${HOME}/models/Qwen2.5-7B"}
    NNODES=${NNODES:-1}
    TP=2
    """
    args = "actor_rollout_ref.model.path=$MODEL_PATH trainer.nnodes=$NNODES a.tp=$TP"
    read = _same_as_bash(setup, args, tmp_path, env={"MODEL_PATH": "/from/env", "TP": "8"})
    # the environment's MODEL_PATH is kept; the script's own TP=2 wins over the environment's 8
    assert read.overrides == ["actor_rollout_ref.model.path=/from/env", "trainer.nnodes=1", "a.tp=2"]


def test_a_recipe_over_continued_lines_with_prefixes_and_comments(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """\
        #!/usr/bin/env bash
        set -xeuo pipefail

        project_name='DAPO'   # a comment after a value
        overlong_buffer_len=$((1024 * 4))
        python3 -m verl.trainer.main_ppo \\
            data.truncation='left' \\
            +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \\
            ++reward_model.reward_kwargs.overlong_buffer_cfg.len=${overlong_buffer_len} \\
            trainer.logger='["console","wandb"]' \\
            trainer.project_name="${project_name}" $@
        """
    )
    cwd = tmp_path.resolve()
    read = _read(script, cwd)
    assert read.errors == [] and read.overrides == _bash(script, cwd)
    assert read.overrides[1:3] == [
        "+actor_rollout_ref.model.override_config.max_position_embeddings=32768",
        "++reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
    ]


def test_the_fully_async_rollout_mode_block(tmp_path: Path) -> None:
    block = """
    rollout_mode="{mode}"
    if [ "$rollout_mode" = "async" ]; then
        export VLLM_USE_V1=1
        return_raw_chat="True"
    fi
    """
    args = "data.return_raw_chat=${return_raw_chat} actor_rollout_ref.rollout.mode=${rollout_mode}"
    read = _same_as_bash(block.format(mode="async"), args, tmp_path)
    assert read.overrides == ["data.return_raw_chat=True", "actor_rollout_ref.rollout.mode=async"]
    # not async: the branch is not taken, and return_raw_chat is never set (bash -u stops there)
    sync = _read(_script(block.format(mode="sync"), args), tmp_path)
    assert len(sync.errors) == 1
    assert "data.return_raw_chat=${return_raw_chat}: return_raw_chat is not set" in sync.errors[0]


@pytest.mark.parametrize(
    ("command", "entry"),
    [
        (
            'ray job submit --address="${RAY_ADDRESS:-http://localhost:8265}" --runtime-env=verl/trainer/runtime_env.yaml'
            " --no-wait -- python3 -m recipe.dapo.main_dapo",
            "recipe.dapo.main_dapo",
        ),
        (
            "python -m verl.experimental.fully_async_policy.fully_async_main",
            "verl.experimental.fully_async_policy.fully_async_main",
        ),
        (
            "python3 -u -m verl.experimental.one_step_off_policy.main_ppo",
            "verl.experimental.one_step_off_policy.main_ppo",
        ),
        ("PY=python3.10; $PY -m recipe.one_step_off_policy.main_ppo", "recipe.one_step_off_policy.main_ppo"),
        (
            "torchrun --nnodes 1 --standalone --nproc_per_node=8 -m verl.trainer.main_ppo",
            "verl.trainer.main_ppo",
        ),
        ("HYDRA_FULL_ERROR=1 python3 recipe/dapo/main_dapo.py", "recipe/dapo/main_dapo.py"),
        ("nohup python3 -m verl.trainer.main_ppo", "verl.trainer.main_ppo"),
    ],
)
def test_the_trainer_entry_is_found_behind_launchers(command: str, entry: str) -> None:
    read = read_script(
        f"n=4\n{command} data.train_batch_size=$n trainer.nnodes=1 > log.txt 2>&1", env=ENV, cwd="/"
    )
    assert (read.entry, read.overrides, read.errors) == (
        entry,
        ["data.train_batch_size=4", "trainer.nnodes=1"],
        [],
    )


def test_the_trainer_is_picked_among_the_scripts_other_commands() -> None:
    script = """
    python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k
    python3 -m verl.trainer.main_generation data.path=~/data/gsm8k/test.parquet
    python3 -m verl.trainer.main_ppo data.train_batch_size=256 2>&1 | tee train.log
    python3 -m verl.model_merger merge --backend fsdp
    """
    read = read_script(textwrap.dedent(script), env=ENV, cwd="/")
    assert (read.entry, read.overrides, read.errors) == (
        "verl.trainer.main_ppo",
        ["data.train_batch_size=256"],
        [],
    )


def test_two_trainers_are_an_error_naming_both() -> None:
    script = "python3 -m verl.trainer.main_ppo data.x=1\npython3 -m recipe.dapo.main_dapo data.x=2\n"
    read = read_script(script, env=ENV, cwd="/")
    assert read.entry is None and read.overrides == []
    assert len(read.errors) == 1
    assert (
        "line 1 (verl.trainer.main_ppo)" in read.errors[0]
        and "line 2 (recipe.dapo.main_dapo)" in read.errors[0]
    )


def test_an_unset_variable_is_an_error_naming_it_its_line_and_the_key(tmp_path: Path) -> None:
    script = _script("n=1", "data.train_batch_size=$n \\\n    actor_rollout_ref.model.path=$MODEL")
    read = _read(script, tmp_path)
    # bash (set -u) stops there too
    with pytest.raises(AssertionError, match="MODEL: unbound variable"):
        _bash(script, tmp_path)
    assert read.errors == [
        "line 4: actor_rollout_ref.model.path=$MODEL: MODEL is not set: "
        "run `MODEL=<value> asyncdapo config from-verl …` or edit the script"
    ]
    assert [(p.line, p.key, p.text) for p in read.problems] == [(4, "actor_rollout_ref.model.path", "$MODEL")]
    # the key is listed as written, never replaced by a default
    assert read.overrides == ["data.train_batch_size=1", "actor_rollout_ref.model.path=$MODEL"]
    assert read.unresolved == {"actor_rollout_ref.model.path=$MODEL": "$MODEL"}
    fixed = _read(script, tmp_path, env={"MODEL": "/models/qwen"})
    assert fixed.errors == [] and fixed.overrides[1] == "actor_rollout_ref.model.path=/models/qwen"


def test_an_unset_variable_is_named_through_the_variables_it_went_through(tmp_path: Path) -> None:
    setup = 'CKPTS_DIR=${CKPTS_DIR:-"${ROOT}/ckpts"}\nlen=$((UNSET_LEN * 2))'
    read = _read(
        _script(setup, "trainer.default_local_dir=${CKPTS_DIR} data.max_response_length=$len"), tmp_path
    )
    assert read.errors == [
        "line 4: trainer.default_local_dir=${CKPTS_DIR}: ROOT is not set (through CKPTS_DIR on line 2): "
        "run `ROOT=<value> asyncdapo config from-verl …` or edit the script",
        # unset in arithmetic: an error too, as under `set -u`, not bash's 0 without it
        "line 4: data.max_response_length=$len: UNSET_LEN is not set (through len on line 3): "
        "run `UNSET_LEN=<value> asyncdapo config from-verl …` or edit the script",
    ]


def test_required_variable_carries_the_scripts_message(tmp_path: Path) -> None:
    read = _read(_script("", 'data.train_files="${TRAIN_FILE:?set TRAIN_FILE to the parquet}"'), tmp_path)
    assert len(read.errors) == 1
    assert "TRAIN_FILE is not set (the script says: set TRAIN_FILE to the parquet)" in read.errors[0]


def test_a_command_substitution_fails_only_where_its_value_is_read(tmp_path: Path) -> None:
    setup = """
    DATE=$(date +%Y%m%d)
    GPUS=$(nvidia-smi --list-gpus | wc -l)
    HOST=`hostname`
    exp_name="dapo-${DATE}"
    """
    unused = _read(_script(setup, "trainer.project_name=DAPO"), tmp_path)
    assert (unused.errors, unused.overrides) == ([], ["trainer.project_name=DAPO"])
    used = _read(_script(setup, "trainer.project_name=DAPO trainer.experiment_name=${exp_name}"), tmp_path)
    assert used.errors == [
        "line 6: trainer.experiment_name=${exp_name}: cannot expand $(date +%Y%m%d) (line 2) "
        "(`date` is not a command this reader runs) (through DATE on line 2, exp_name on line 5): "
        "set the value by hand: write it in the script"
    ]
    gpus = _read(_script(setup, "trainer.n_gpus_per_node=$GPUS"), tmp_path)
    assert (
        "cannot expand $(nvidia-smi --list-gpus | wc -l) (line 3) (a pipe `|` is not run)" in gpus.errors[0]
    )


def test_a_condition_that_cannot_be_evaluated_makes_only_what_it_changes_unknown(tmp_path: Path) -> None:
    setup = """
    if [ -f /etc/verl/cluster.env ]; then
        n=16
        same=8
    elif command -v nvidia-smi >/dev/null; then
        n=4
        same=8
    else
        same=8
    fi
    """
    read = _read(_script(setup, "a.same=$same a.n=$n"), tmp_path)
    assert read.overrides[0] == "a.same=8"  # every way through agrees
    assert read.errors == [
        "line 11: a.n=$n: n is set under `[ -f /etc/verl/cluster.env ]` (line 2), which cannot be evaluated "
        "(`-f` tests the file system): set the value by hand: write it in the script outside the condition"
    ]
    assert _read(_script(setup, "a.same=$same"), tmp_path).errors == []


def test_a_loop_is_not_run_and_what_it_sets_is_unknown(tmp_path: Path) -> None:
    setup = "for i in $(seq 1 4); do last=$i; done\nwhile (( $# )); do shift; skipped=1; done"
    read = _read(_script(setup, "a.last=$last a.skipped=${skipped:-no}"), tmp_path)
    assert read.overrides[1] == "a.skipped=no"  # no arguments: that loop never runs, as in bash
    assert len(read.errors) == 1 and read.errors[0].startswith(
        "line 4: a.last=$last: last is set inside the loop `for i in $(seq 1 4)` (line 2), which is not run"
    )
    assert read.unresolved == {"a.last=$last": "$last"}


def test_a_comment_inside_a_continued_command_drops_the_rest_as_bash_does(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """\
        python3 -m verl.trainer.main_ppo \\
            data.train_batch_size=8 \\
            # the next keys are cut off by this comment
            trainer.total_epochs=2 \\
            trainer.nnodes=1
        """
    )
    read = _read(script, tmp_path)
    assert read.overrides == ["data.train_batch_size=8"]
    assert len(read.errors) == 1 and read.errors[0].startswith(
        "line 4: `trainer.total_epochs=2 trainer.nnodes=1` runs as a command of its own"
    )


def test_a_script_that_stops_before_the_trainer(tmp_path: Path) -> None:
    setup = 'if [ "$#" -lt 2 ]; then\n    echo "usage: $0 <nproc> <save_path>"\n    exit 1\nfi'
    read = _read(_script(setup, "trainer.nnodes=1"), tmp_path)
    assert (read.entry, read.overrides) == (None, [])
    assert read.errors == [
        "line 4: the script stops at `exit 1` before it runs a verl trainer "
        "(from-verl reads it without arguments, with this environment): edit the script"
    ]


def test_what_bash_cannot_parse_is_returned_not_raised(tmp_path: Path) -> None:
    read = _read("if [ -n x ]; then\n  a=1\n", tmp_path)
    assert read.overrides == [] and len(read.errors) == 1
    assert read.errors[0].startswith("line 3: bash cannot parse the script: expected `fi`")


def test_the_scripts_own_path_is_needed_for_dollar_zero(tmp_path: Path) -> None:
    script = _script('HERE=$(cd "$(dirname "$0")" && pwd)', "data.train_files=$HERE/train.parquet")
    without = read_script(script, env=ENV, cwd=str(tmp_path))
    assert without.errors[0].startswith(
        "line 3: data.train_files=$HERE/train.parquet: $0 is the script's own path"
    )
    with_path = read_script(script, env=ENV, cwd="/", path=str(tmp_path / "run.sh"))
    assert with_path.overrides == [f"data.train_files={tmp_path}/train.parquet"]
