"""Storage by URI for everything outside Spark (`store`), the output layout (`paths`) and Spark's
own atomic directory commits (`hadoop`)."""

from sparkml_dist.storage.store import (
    SCHEMES,
    Entry,
    Location,
    Scheme,
    absolute,
    atomic_writer,
    check_writable,
    delete,
    exists,
    is_dir,
    join,
    list_dir,
    list_files,
    local_copy,
    local_path,
    locate,
    makedirs,
    name_of,
    open_input,
    read_bytes,
    read_json,
    read_text,
    register_scheme,
    spark_path,
    upload,
    write_bytes,
    write_json,
    write_text,
)

__all__ = [
    "SCHEMES", "Entry", "Location", "Scheme", "absolute", "atomic_writer", "check_writable", "delete", "exists",
    "is_dir", "join", "list_dir", "list_files", "local_copy", "local_path", "locate", "makedirs", "name_of",
    "open_input", "read_bytes",
    "read_json", "read_text", "register_scheme", "spark_path", "upload", "write_bytes", "write_json", "write_text",
]
