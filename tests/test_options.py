"""The options table (allocator/src/options.h): everything about an option comes from its
row, so what one entry point accepts, every entry point accepts, and reads back the same."""
from __future__ import annotations

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
