"""The options table (allocator/src/options.h): everything about an option comes from its
row, so what one entry point accepts, every entry point accepts, and reads back the same."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pyalloc
from pyalloc.options import build_options, effective, env_name, options_table

# A value other than the default for each kind, to see each row parsed and printed.
OTHER = {"size": "64KiB", "int": "7", "bool": None, "fraction": "0.25", "budget": "80%"}


def test_the_defaults_are_the_table_and_read_back_the_same():
    defaults = effective("")
    assert list(defaults) == [row["name"] for row in options_table()]  # table order
    for row in options_table():
        # Each default, given explicitly, gives the same normalized value as no value.
        assert effective(f"{row['name']}:{row['default']}")[row["name"]] == defaults[row["name"]]
    # What the engine prints parses back to itself.
    text = ",".join(f"{k}:{v}" for k, v in defaults.items())
    assert effective(text) == defaults


@pytest.mark.parametrize("row", options_table(), ids=lambda row: row["name"])
def test_every_option_parses_a_value_of_its_kind_and_prints_what_reads_back(row):
    if row["kind"] == "choice":
        words = [w.strip() for w in row["choices"].split(",")]
        assert row["default"] in words
        values = words
    elif row["kind"] == "bool":
        values = ["false" if row["default"] == "true" else "true"]
    elif row["name"] == "max_split_size":
        values = ["32MiB"]   # 0 or above the 20 MiB segment size (check_rule)
    else:
        values = [OTHER[row["kind"]]]
    for value in values:
        printed = effective(f"{row['name']}:{value}")[row["name"]]
        assert effective(f"{row['name']}:{printed}")[row["name"]] == printed
        if row["kind"] == "choice":
            assert printed == value


def test_one_option_variables_set_one_option_and_keyword_arguments_win():
    env = {"PYALLOC_CONF": "evict_strategy:dtr,prefetch:2",
           env_name("evict_strategy"): "dte", "PYALLOC_INPLACE_UPDATE": "1"}
    chosen = effective(build_options(environ=env))
    assert chosen["evict_strategy"] == "dte"       # the variable over PYALLOC_CONF
    assert chosen["prefetch"] == "2"               # PYALLOC_CONF where no variable says
    assert chosen["inplace_update"] == "true"
    chosen = effective(build_options(overrides={"evict_strategy": "window"}, environ=env))
    assert chosen["evict_strategy"] == "window"    # keyword arguments over both


def test_a_bad_one_option_variable_names_the_option_and_the_accepted_form():
    with pytest.raises(ValueError, match="'prefetch': expected a non-negative integer"):
        build_options(environ={"PYALLOC_PREFETCH": "many"})
    with pytest.raises(ValueError, match="one of: none, recompute, swap, hybrid"):
        build_options(environ={"PYALLOC_POLICY": "sometimes"})


def test_variables_that_name_no_option_are_not_options():
    # pyalloc's other variables (the library, the shim cache, the stats file) are not read
    # as options, and an unknown PYALLOC_ variable changes nothing.
    env = {"PYALLOC_LIBRARY": "/nowhere", "PYALLOC_STATS_FILE": "auto", "PYALLOC_NOT_AN_OPTION": "1"}
    assert effective(build_options(environ=env)) == effective("")


def test_the_table_names_its_environment_variable_and_choices():
    rows = {row["name"]: row for row in options_table()}
    assert rows["evict_strategy"]["choices"] == "dtr, dte, window"
    assert rows["budget"]["choices"] == ""
    assert "`PYALLOC_INPLACE_UPDATE`" in pyalloc.options.markdown_table()


# --- PyTorch's PYTORCH_CUDA_ALLOC_CONF (pyalloc/torch_conf.py) ---------------------------

def torch_conf_options(environ, **overrides):
    return effective(build_options(None, overrides, environ=environ, torch_alloc_conf=True))


def test_pytorch_alloc_conf_keys_with_a_pyalloc_meaning_become_options():
    chosen = torch_conf_options({"PYTORCH_CUDA_ALLOC_CONF":
                                 "expandable_segments:True, max_split_size_mb:512,"
                                 "per_process_memory_fraction:0.5,"
                                 "pinned_use_cuda_host_register:True,backend:native"})
    assert chosen["expandable"] == "true"
    assert chosen["max_split_size"] == effective("max_split_size:512MiB")["max_split_size"]
    assert chosen["budget"] == effective("budget:0.5")["budget"]
    # Off unless asked: an engine made for a test does not read it.
    plain = effective(build_options(None, {}, environ={
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    assert plain["expandable"] == "false"


def test_pyalloc_settings_rank_above_pytorchs_and_the_newer_variable_is_read_first():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:100",
           "PYTORCH_ALLOC_CONF": "max_split_size_mb:200"}
    chosen = torch_conf_options(env)
    assert chosen["max_split_size"] == effective("max_split_size:200MiB")["max_split_size"]
    assert chosen["expandable"] == "false"  # only PYTORCH_ALLOC_CONF is read
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:100",
           "PYALLOC_CONF": "expandable:false", "PYALLOC_MAX_SPLIT_SIZE": "300MiB"}
    chosen = torch_conf_options(env)
    assert chosen["expandable"] == "false"
    assert chosen["max_split_size"] == effective("max_split_size:300MiB")["max_split_size"]
    assert torch_conf_options(env, max_split_size="400MiB")["max_split_size"] == \
        effective("max_split_size:400MiB")["max_split_size"]


def test_pytorch_alloc_conf_keys_without_a_pyalloc_meaning_are_refused_all_at_once():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6,expandable_segments:yes,"
                                      "roundup_power2_divisions:4,backend:cudaMallocAsync,"
                                      "max_split_size_mb:8,no_such_key:1,loose"}
    with pytest.raises(ValueError) as info:
        torch_conf_options(env)
    message = str(info.value)
    assert message.startswith("PYTORCH_CUDA_ALLOC_CONF has settings pyalloc cannot honour")
    for expected in ("garbage_collection_threshold: pyalloc keeps freed segments cached",
                     "expandable_segments must be True or False, got 'yes'",
                     "roundup_power2_divisions:", "cudaMallocAsync cannot be combined",
                     "max_split_size_mb must be more than 20", "no_such_key: not a key",
                     "'loose' is not key:value", "install(torch_alloc_conf=False)"):
        assert expected in message, expected


def test_install_reads_pytorch_alloc_conf():
    program = Path(__file__).parent / "programs" / "torch_alloc_conf.py"
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "refused True False" in proc.stdout
    options = proc.stdout.split("options ", 1)[1]
    assert "expandable:true" in options and f"max_split_size:{64 << 20}," in options
